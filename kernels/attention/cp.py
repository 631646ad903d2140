"""Context parallelism of decayed attention: one sequence split over the ranks of a process group, rank r holding
the queries, keys and values of tokens [r T/N, (r + 1) T/N).

Query i sees keys j <= i, so rank r needs the keys and values of every slice up to its own: one differentiable
all_gather brings all of them (the Llama 3 way: memory for the whole sequence's keys and values, not for its
scores), and rank r attends with its T/N queries as the last of the (r + 1) T/N keys (decayed_attention's Tq <= Tk
form). A forget gate's cumulative log-decay c is kept per slice (c restarts at 0 on each rank); the slices before
rank j add their totals:

    c_t (global) = c_t (slice j) + sum_{i < j} c_end (slice i)

ALiBi's slopes need nothing: -m (i - j) is read from the positions, which the Tq <= Tk form places right.

On CUDA the Triton kernel needs Tq = Tk, so a gate, slopes or a power there runs the kernel on queries padded with
zeros at the front (their rows are dropped, and they add nothing to any gradient): memory stays linear in the
sequence, at up to twice the work of the rows kept. Plain softmax goes to SDPA's flash kernels with a causal mask
aligned to the last query (causal_lower_right). The slices are contiguous, so later ranks attend to more keys than
earlier ones (no load balancing yet).

Packed documents (cu_seqlens in the slice's coordinates, kernels/varlen.py: slice_boundaries): each rank labels its
tokens with the position where their document starts, one all_gather of the labels gives the boundaries of the keys'
range [0, (r + 1) T/N), and the queries, padded at the front to the keys' length, attend within their documents
(decayed_attention's packed form). The gate's sums and ALiBi's distances are differences inside one document.
"""

from __future__ import annotations

import torch

from ..cp import gather
from ..varlen import document_ids
from . import decayed_attention
from .kernel import _triton_ok


def decayed_attention_cp(q, k, v, *, log_decay=None, slopes=None, power=None, scale=None, group=None,
                         impl: str | None = None, cu_seqlens=None, bias_for=None):
    """This rank's slice of decayed_attention over the whole sequence split across `group` (the default group when
    None). q, k, v [B, T_r, H, D] and log_decay [B, T_r, H] (c within the slice) are this rank's; cu_seqlens: packed
    documents (B = 1) in the slice's coordinates; bias_for(keys) -> an additive score bias [B or 1, H, T_r, end]
    against the gathered keys (T5, Transformer-XL: softmax through the Tq <= Tk form). impl: "triton" (the kernel
    on padded queries; Triton's interpreter on a CPU), "torch" (the Tq <= Tk form; packed documents pad the queries
    too), or default: the kernel where it applies and there is a gate, slopes, a power or packing."""
    import torch.distributed as dist
    group = group or dist.group.WORLD
    rank = dist.get_rank(group)
    B, T, H, D = k.shape
    end = (rank + 1) * T

    def upto_here(x):  # [world, B, T, ...] -> the slices 0..rank joined along time: [B, end, ...]
        # a copy (cat), never a view: a view of a collective's output can reach a kernel before the collective has
        # been waited on
        return torch.cat(x[: rank + 1].unbind(0), 1)
    keys, values = upto_here(gather(k, group)), upto_here(gather(v, group))
    c = None
    if log_decay is not None:
        cs = gather(log_decay, group)  # [world, B, T, H]
        before = torch.cumsum(cs[:, :, -1], 0) - cs[:, :, -1]  # each slice's sum of the slices before it
        c = upto_here(cs + before[:, :, None])
    cu = None
    if cu_seqlens is not None:  # where each key's document starts, from every slice up to this one
        starts = rank * T + cu_seqlens[document_ids(cu_seqlens, T)]
        starts = gather(starts, group)[: rank + 1].reshape(-1).clamp(min=0)
        cu = torch.cat([torch.unique_consecutive(starts), starts.new_tensor([end])])
    if bias_for is not None:  # a bias reads the keys' positions (and Transformer-XL the keys themselves)
        if cu_seqlens is not None or c is not None or slopes is not None or power is not None:
            raise ValueError("decayed_attention_cp: an additive bias takes plain softmax scores over one sequence")
        return decayed_attention(q, keys, values, bias=bias_for(keys), scale=scale, impl="torch")
    if impl is None:
        special = c is not None or slopes is not None or power is not None or cu is not None
        impl = "triton" if special and _triton_ok(keys, keys, None) else "torch"
    if impl == "triton" or cu is not None:  # the kernel (Tq = Tk) on queries padded to the keys' length
        q = torch.cat([q.new_zeros(B, end - T, H, D), q], 1)
        return decayed_attention(q, keys, values, log_decay=c, slopes=slopes, power=power, scale=scale,
                                 cu_seqlens=cu, impl=impl)[:, -T:]
    return decayed_attention(q, keys, values, log_decay=c, slopes=slopes, power=power, scale=scale, impl="torch")
