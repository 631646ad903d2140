"""Positional schemes, one file each; importing this package registers them all (see base.py)."""

from . import alibi, learned, nope, rope, selective_rope, sinusoidal, t5, vo_rope, xl  # noqa: F401  (registration)
from .base import KINDS, REGISTRY, ConfigError, Dims, PositionalScheme, build_pe

__all__ = ["KINDS", "REGISTRY", "ConfigError", "Dims", "PositionalScheme", "build_pe"]
