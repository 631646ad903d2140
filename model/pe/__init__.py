"""Positional schemes, one file each; importing this package registers them all (see base.py)."""

from . import (alibi, learned, learned_rotation, nope, rope, selective_rope, sinusoidal, t5,  # noqa: F401
               vo_rope, xl)
from ..core.context import Dims
from .base import KINDS, REGISTRY, ConfigError, PositionalScheme, build_pe

__all__ = ["KINDS", "REGISTRY", "ConfigError", "Dims", "PositionalScheme", "build_pe"]
