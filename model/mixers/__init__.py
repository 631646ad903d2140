"""Token mixers (backbones), one file per family; importing this package registers them (see base.py)."""

from . import attention, base_conv, delta_net, fox, gla, linear_attention, oja, path, scalar_decay, sympow  # noqa: F401,E501
from .base import REGISTRY, Mixer

__all__ = ["REGISTRY", "Mixer"]
