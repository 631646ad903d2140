"""RoPE (Su et al.): rotate q and k by angles phi_t = t * theta, theta_i = base^(-2i/d_head).

A cumulative rotation with constant increments dphi_s = 1 and temperatures theta (kernels/rotary.py); the dual of
the complex forget gate A_t = exp(i Omega) of a linear recurrence (seed 000, section 4)."""

import torch

from kernels.rotary import rope_frequencies, rotate

from .base import PositionalScheme, register


@register("rope")
class RoPE(PositionalScheme):
    kind = "rotary"

    def __init__(self, dims, *, base: float = 10000.0):
        super().__init__(dims)
        self.base = base

    def frequencies(self, dim: int, device) -> torch.Tensor:
        """theta [dim/2]. The rotated dimension is the mixer's q/k head size, which need not be d_model / n_heads
        (GLA halves it)."""
        if dim % 2:
            raise ValueError(f"pe={self.name} rotates channel pairs: the q/k head size {dim} must be even")
        return rope_frequencies(dim, self.base).to(device=device, dtype=torch.float32)

    def angles(self, T: int, offset: int, dim: int, device, positions=None) -> torch.Tensor:
        """phi [T, 1, dim/2] for positions offset .. offset+T-1, or the given positions [T] (broadcasts over batch
        and heads)."""
        pos = torch.arange(offset, offset + T, device=device) if positions is None else positions
        return (pos.float()[:, None] * self.frequencies(dim, device)[None, :])[:, None, :]

    def forward(self, q, k, *, offset: int = 0, x=None, cache=None, positions=None):
        # The cumulative sum of constant increments has the closed form t * theta, which torch.compile fuses into
        # the neighbouring ops; cumulative_rotation(q, k, None, theta, phi0=offset - 1) computes the same
        # (tests/test_rotary.py), and is what a scheme with data-dependent increments uses.
        phi = self.angles(q.shape[1], offset, q.shape[-1], q.device, positions)
        return rotate(q, phi), rotate(k, phi)
