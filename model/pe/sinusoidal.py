"""Sinusoidal absolute embedding (Vaswani et al. 2017), added to the token embeddings:

    PE[pos, 2i] = sin(pos / base^(2i/d)),   PE[pos, 2i+1] = cos(pos / base^(2i/d))
"""

import torch

from ..core.context import TRAINING
from .base import PositionalScheme, register


def sinusoid_table(positions: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """[len(positions), dim] table, interleaved sin/cos as in the paper."""
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim)
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    out = torch.stack([torch.sin(ang), torch.cos(ang)], dim=-1).reshape(len(positions), -1)
    return out[:, :dim].float()


@register("sinusoidal")
class Sinusoidal(PositionalScheme):
    context_parallel = True  # positions from ctx.offset (packed: ctx.positions)
    kind = "absolute"

    def __init__(self, dims, *, base: float = 10000.0):
        super().__init__(dims)
        self.base = base

    def embed(self, x, ctx=TRAINING):
        pos = ctx.positions(x.shape[1])  # packed documents: each restarts at 0
        if pos is None:
            pos = ctx.offset + torch.arange(x.shape[1], device=x.device)  # offset: int or 0-d (decoding buffers)
        return x + sinusoid_table(pos, x.shape[-1], self.base).to(x.dtype)
