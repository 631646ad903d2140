"""Context parallelism of the gated recurrence: one sequence split over the ranks of a process group, each rank
holding a contiguous slice of the tokens (rank r: tokens [r T/N, (r + 1) T/N)).

The recurrence S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T is affine in its initial state, so a slice started from
S = 0 is corrected exactly by the state handed over from the slices before it:

    run from S = 0:      o_t^0, and the slice's final state F_r = S_end^0
    slice decay:         D_r = exp(sum_{t in slice r} g_t)                          (per key channel, or per head)
    carried state:       S0_r = sum_{j < r} (prod_{j < i < r} D_i) F_j  =  D_{r-1} S0_{r-1} + F_{r-1}, S0_0 = 0
    output:              o_t = o_t^0 + scale (q_t * exp(G_t))^T S0_r,   G_t = sum_{s <= t in slice} g_s

One all_gather of (F_r, D_r) replaces the sequential hand-over; it is differentiable (its backward sums each
rank's gradient contributions back to the rank that owns the slice), so gradients of every rank's q, k, v, g equal
the unsplit sequence's. The local runs use any implementation of `gated` (FLA's kernels on CUDA).
"""

from __future__ import annotations

import torch


def gather(x, group):
    """[world, *x.shape]: every rank's x in rank order. Differentiable: its backward sums each rank's gradient
    contributions back to the rank that owns the slice (so every rank must run it, and its backward)."""
    from torch.distributed import _functional_collectives as fc
    # torch renamed the autograd gather (the old name warns from 2.12 on)
    f = getattr(fc, "all_gather_single_autograd", None) or fc.all_gather_tensor_autograd
    return f(x[None].contiguous(), 0, group)


def gated_cp(q, k, v, g, scale, group=None, impl: str | None = None):
    """This rank's slice of o for the gated recurrence over the whole sequence split across `group` (the default
    group when None). q, k [B, T_r, H, K], v [B, T_r, H, V], g [B, T_r, H, K] or [B, T_r, H, 1] (log gate)."""
    import torch.distributed as dist

    from . import gated
    group = group or dist.group.WORLD
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    o, final = gated(q, k, v, g, scale, None, True, impl=impl)
    dt = torch.promote_types(q.dtype, torch.float32)  # the hand-over in at least fp32, as the state is kept
    G = torch.cumsum(g.to(dt), 1)  # [B, T_r, H, K or 1]
    decay = torch.exp(G[:, -1])  # [B, H, K or 1]
    finals = gather(final.to(dt), group)  # [world, B, H, K, V]
    decays = gather(decay, group)  # [world, B, H, K or 1]
    # every rank's graph holds every gathered slice (masked out after it, not left out), so that each rank's backward
    # joins the same collectives
    S0 = torch.zeros_like(finals[0])
    for j in range(world):
        keep = float(j < rank)
        S0 = keep * (decays[j][..., None] * S0 + finals[j]) + (1.0 - keep) * S0
    carried = torch.einsum("bthk,bhkv->bthv", q.to(dt) * torch.exp(G), S0) * scale
    return (o.to(dt) + carried).to(o.dtype)
