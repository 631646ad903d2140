"""Cumulative rotation: the one primitive behind every rotary scheme.

A rotary scheme rotates each (x_i, x_{i+D/2}) channel pair of q and k (GPT-NeoX half-split layout) by an angle
that is a per-channel temperature times a running sum of per-token increments:

    Phi_t = Phi_0 + sum_{s <= t} dphi_s            (raw angle, fp32, restarts at every document of a packed batch)
    phi_t = theta * Phi_t
    rot(x, phi)_t = [x1 cos(phi_t) - x2 sin(phi_t),  x1 sin(phi_t) + x2 cos(phi_t)],   x = [x1, x2]

- RoPE:                     dphi_s = 1 (no tensor at all), theta_i = base^(-2i/D), Phi_0 = offset - 1: phi_t = t theta.
- Selective RoPE (seed 004): dphi_s = conv(W q_s) (times a phase gate), theta = a temperature schedule.
- learned / conformal rotation (seed 003 section 3.2): dphi_s = beta_s (one per head, broadcast over channels).

Because R(a)^T R(b) = R(b - a), <rot(q, phi_i), rot(k, phi_j)> = q^T R(phi_j - phi_i) k depends only on the
angle accumulated between j and i: the rotation is the dual of the complex forget gate exp(i Omega) of a linear
recurrence (seed 000, section 4). `tests/test_duality.py` checks that equality.

Three implementations of the same function:
- `cumulative_rotation_reference` (reference.py): PyTorch, from the equations (CPU path and test oracle, any
  dtype incl. float64).
- a fused Triton kernel (kernel.py; CUDA path; the interpreter runs it on CPU when TRITON_INTERPRET=1).
  torch.compile cannot fuse a cumulative sum with what follows it, so the prelude costs several passes over q and k;
  the kernel reads q, k and the increments once and writes q and k once, in one launch. Each program takes a chunk
  of BT tokens of one head, publishes its chunk total, and finds the total of all earlier chunks of its document by
  decoupled look-back (Merrill & Garland 2016) over the totals the others publish; programs take chunks in the order
  of an atomic ticket, so a program only ever waits on chunks already running. The backward pass does the same from
  the last chunk to the first: the increment gradient is a reverse cumulative sum of dL/dphi.
- `cumulative_rotation`: the autograd-aware entry point; Triton on CUDA, the reference elsewhere.
"""

from __future__ import annotations

import torch

from .kernel import _triton_rotation, triton
from .reference import (
    _check,
    cumulative_angles,
    cumulative_rotation_reference,
    rope_frequencies,
    rotate,
    rotate_cos_sin,
)

__all__ = ["cumulative_angles", "cumulative_rotation", "cumulative_rotation_reference", "rope_frequencies", "rotate",
           "rotate_cos_sin"]


def cumulative_rotation(q, k, dphi, theta, phi0=None, cu_seqlens=None, impl: str | None = None):
    """Rotate q and k [B, T, H, D] by phi_t = theta * (phi0 + sum_{s<=t} dphi_s); returns (q_rot, k_rot, Phi_T).

    dphi: [B, T, H, D/2] or [B, T, H, 1] increments, or None for dphi = 1 (RoPE). theta: [D/2] or [H, D/2].
    phi0: a number or [B, H, D/2] raw angle to continue from (a decoding cache); Phi_T [B, H, D/2] is the raw angle
    after the last token, to cache (None for packed input). cu_seqlens: document boundaries of packed input (B = 1).
    impl: "triton" or "torch"; default Triton on CUDA, the reference elsewhere (the interpreter runs the Triton
    kernels on CPU when TRITON_INTERPRET=1, which is how CI tests them)."""
    _check(q, k, dphi, theta, phi0, cu_seqlens)
    if impl is None:
        impl = "triton" if q.is_cuda and triton is not None else "torch"
    if impl == "torch":
        return cumulative_rotation_reference(q, k, dphi, theta, phi0, cu_seqlens)
    if impl != "triton":
        raise ValueError(f"cumulative_rotation: impl must be 'triton' or 'torch', got {impl!r}")
    if triton is None:
        raise RuntimeError("cumulative_rotation: impl='triton' needs the triton package")
    if q.dtype == torch.float64:
        raise ValueError("cumulative_rotation: the Triton kernel takes fp32/bf16/fp16; use impl='torch' for float64")
    return _triton_rotation(q, k, dphi, theta, phi0, cu_seqlens)
