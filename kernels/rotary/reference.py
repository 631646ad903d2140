"""The cumulative rotation from its equations (kernels/rotary/__init__.py): the CPU path, any dtype including
float64, and the oracle the Triton kernel is tested against."""

from __future__ import annotations

import torch


def rope_frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """theta_i = base^(-2i/dim), i = 0 .. dim/2 - 1 (Su et al.)."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def cumulative_angles(dphi: torch.Tensor, phi0: torch.Tensor | None = None, dim: int = 1) -> torch.Tensor:
    """Phi_t = Phi_0 + cumsum(dphi)_t along `dim`, in fp32 at least (angles grow with t)."""
    phi = torch.cumsum(dphi.to(torch.promote_types(dphi.dtype, torch.float32)), dim=dim)
    if phi0 is not None:
        phi = phi + (phi0.to(phi.dtype).unsqueeze(dim) if torch.is_tensor(phi0) else phi0)
    return phi


def rotate(x: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (x[..., :D/2], x[..., D/2:]) of x by angles phi (shape broadcastable to x[..., :D/2])."""
    return rotate_cos_sin(x, torch.cos(phi), torch.sin(phi))


def rotate_cos_sin(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """rotate() given cos(phi) and sin(phi): a scheme whose angles do not depend on the data tabulates them once
    (sin and cos of every element of q and k made the compiled 124m RoPE model compute-bound: docs/throughput)."""
    half = x.shape[-1] // 2
    dt = torch.promote_types(x.dtype, torch.float32)
    x1, x2 = x[..., :half].to(dt), x[..., half:].to(dt)
    cos, sin = cos.to(dt), sin.to(dt)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


def _check(q, k, dphi, theta, phi0, cu_seqlens):
    if q.shape != k.shape or q.dim() != 4 or q.shape[-1] % 2:
        raise ValueError(f"cumulative_rotation: q and k must both be [B, T, H, D] with D even, got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    B, T, H, D = q.shape
    if dphi is not None and (dphi.shape[:3] != (B, T, H) or dphi.shape[3] not in (1, D // 2)):
        raise ValueError(f"cumulative_rotation: increments must be [B, T, H, D/2] or [B, T, H, 1] = "
                         f"[{B}, {T}, {H}, {D // 2} or 1], got {tuple(dphi.shape)}")
    if theta.shape not in ((D // 2,), (H, D // 2)):
        raise ValueError(f"cumulative_rotation: temperatures must be [D/2] or [H, D/2], got {tuple(theta.shape)}")
    if cu_seqlens is not None and (B != 1 or phi0 is not None):
        raise ValueError("cumulative_rotation: packed input (cu_seqlens) needs B = 1 and no initial angle")


def cumulative_rotation_reference(q, k, dphi, theta, phi0=None, cu_seqlens=None):
    """Returns (rot(q, phi), rot(k, phi), Phi_T [B, H, D/2]); see the module docstring. dphi None means dphi = 1;
    phi0 is a number or [B, H, D/2]; cu_seqlens [N + 1] (int) restarts the sum at each document (B = 1)."""
    _check(q, k, dphi, theta, phi0, cu_seqlens)
    B, T, H, D = q.shape
    dt = torch.promote_types(q.dtype, torch.float32)
    inc = (torch.ones(B, T, 1, 1, dtype=dt, device=q.device) if dphi is None else dphi).to(dt)
    if cu_seqlens is None:
        raw = cumulative_angles(inc, phi0)
    else:
        bounds = cu_seqlens.tolist()
        raw = torch.cat([torch.cumsum(inc[:, s:e], 1) for s, e in zip(bounds[:-1], bounds[1:])], 1)
    phi = raw * theta.to(dt)
    final = None if cu_seqlens is not None else raw[:, -1].expand(B, H, D // 2)
    return rotate(q, phi), rotate(k, phi), final
