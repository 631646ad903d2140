"""NoPE: no positional signal beyond the causal mask. Dual of linear attention with A_t = 1 (seed 000, section 1)."""

from .base import PositionalScheme, register


@register("nope")
class NoPE(PositionalScheme):
    context_parallel = True  # positions from ctx.offset
    kind = "none"
