"""The collectives of context parallelism: one sequence split over the ranks of a process group, each rank holding a
contiguous slice (rank r: tokens [r T/N, (r + 1) T/N)). The recurrences' hand-over (recurrences/cp.py), attention's
gathered keys (attention/cp.py) and the model's short convolutions and accumulated rotations use them.

Short convolutions (from_previous): a token's causal convolution reads the K - 1 inputs before it, so each rank
prepends the previous slice's last K - 1 (zeros on rank 0) and drops those outputs.
"""

from __future__ import annotations


def gather(x, group):
    """[world, *x.shape]: every rank's x in rank order. Differentiable: its backward sums each rank's gradient
    contributions back to the rank that owns the slice (so every rank must run it, and its backward)."""
    from torch.distributed import _functional_collectives as fc
    # torch renamed the autograd gather (the old name warns from 2.12 on)
    f = getattr(fc, "all_gather_single_autograd", None) or fc.all_gather_tensor_autograd
    return f(x[None].contiguous(), 0, group)


def from_previous(x, group):
    """The previous rank's x (zeros on rank 0), differentiable: its gradient goes back to that rank."""
    import torch.distributed as dist
    rank = dist.get_rank(group)
    # every rank uses the gathered tensor (rank 0 times zero), so every rank joins its backward
    return gather(x, group)[rank - 1] * float(rank > 0)
