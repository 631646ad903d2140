"""Cumulative rotation: the one primitive behind every rotary scheme.

A rotary scheme rotates each (x_i, x_{i+D/2}) channel pair of q and k (GPT-NeoX half-split layout) by an
angle that is a running sum of per-token increments:

    phi_t = phi_{offset} + sum_{s <= t} dphi_s                        (fp32, per pair of channels)
    rot(x, phi)_t = [x1 cos(phi_t) - x2 sin(phi_t),  x1 sin(phi_t) + x2 cos(phi_t)],  x = [x1, x2]

- RoPE: dphi_s = theta (a constant), so phi_t = t * theta.
- Selective RoPE: dphi_s is data dependent (issue #4).
- learned / conformal rotation: dphi_s = beta_s * theta (seed 003 section 3.2).

Because R(a)^T R(b) = R(b - a), <rot(q, phi_i), rot(k, phi_j)> = q^T R(phi_j - phi_i) k depends only on the
angle accumulated between j and i: the rotation is the dual of the complex forget gate exp(i Omega) of a linear
recurrence (seed 000, section 4). `tests/test_duality.py` checks that equality.

This file holds the PyTorch reference; a fused Triton kernel with the same signature plugs in beside it.
"""

from __future__ import annotations

import torch


def cumulative_angles(dphi: torch.Tensor, phi0: torch.Tensor | None = None, dim: int = 1) -> torch.Tensor:
    """phi_t = phi0 + cumsum(dphi)_t along `dim`, accumulated in fp32 (angles grow with t)."""
    phi = torch.cumsum(dphi.float(), dim=dim)
    if phi0 is not None:
        phi = phi + phi0.float().unsqueeze(dim)
    return phi


def rotate(x: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (x[..., :D/2], x[..., D/2:]) of x by angles phi (shape broadcastable to x[..., :D/2])."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    cos, sin = torch.cos(phi), torch.sin(phi)
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.to(x.dtype)


def rope_frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """theta_i = base^(-2i/dim), i = 0 .. dim/2 - 1 (Su et al.)."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
