"""The collectives of context parallelism: one sequence split over the ranks of a process group, each rank holding a
contiguous slice (rank r: tokens [r T/N, (r + 1) T/N)). The recurrences' hand-over (recurrences/cp.py), attention's
gathered keys (attention/cp.py) and the model's short convolutions and accumulated rotations use them.

Short convolutions (from_previous): a token's causal convolution reads the K - 1 inputs before it, so each rank
prepends the previous slice's last K - 1 (zeros on rank 0) and drops those outputs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# torch 2.13 renamed the flat collectives (the old names warn)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _Gather(torch.autograd.Function):
    """All-gather forward, reduce-scatter (sum) backward, with c10d's blocking calls. Not torch's functional
    all_gather_single_autograd: beside DDP on gloo it corrupted the heap about once in 600 CPU steps (glibc aborts,
    "malloc(): unaligned tcache chunk detected"; 3,600 steps with these calls ran clean). On NCCL a blocking call
    only orders the stream, and torch.compile traces these calls into its functional collectives."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.contiguous()
        out = x.new_empty(dist.get_world_size(group) * x.numel())
        _all_gather(out, x.view(-1), group=group)
        return out.view(-1, *x.shape)

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty(grad[0].numel())
        _reduce_scatter(out, grad.contiguous().view(-1), group=ctx.group)
        return out.view(grad.shape[1:]), None


def gather(x, group):
    """[world, *x.shape]: every rank's x in rank order. Differentiable: its backward sums each rank's gradient
    contributions back to the rank that owns the slice (so every rank must run it, and its backward)."""
    return _Gather.apply(x, group)


def from_previous(x, group):
    """The previous rank's x (zeros on rank 0), differentiable: its gradient goes back to that rank."""
    rank = dist.get_rank(group)
    # every rank uses the gathered tensor (rank 0 times zero), so every rank joins its backward
    return gather(x, group)[rank - 1] * float(rank > 0)


def hand_over(transition, final, group, apply):
    """What the slices before this rank hand it, for a state affine in the one before: S_r = apply(A_{r-1}, S_{r-1})
    + F_{r-1}, S_0 = 0, from every rank's (A, F) in one gather each (the recurrences' states, an accumulated
    rotation's angle). Later slices are masked out, not left out, so that every rank joins the gathers' backward."""
    rank = dist.get_rank(group)
    transitions, finals = gather(transition, group), gather(final, group)
    S = torch.zeros_like(finals[0])
    for j in range(len(finals)):
        keep = float(j < rank)
        S = keep * (apply(transitions[j], S) + finals[j]) + (1.0 - keep) * S
    return S
