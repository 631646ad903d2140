"""Context parallelism of the linear recurrences: one sequence split over the ranks of a process group, each rank
holding a contiguous slice of the tokens (rank r: tokens [r T/N, (r + 1) T/N)).

Gated recurrence (gated_cp):

The recurrence S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T is affine in its initial state, so a slice started from
S = 0 is corrected exactly by the state handed over from the slices before it:

    run from S = 0:      o_t^0, and the slice's final state F_r = S_end^0
    slice decay:         D_r = exp(sum_{t in slice r} g_t)                          (per key channel, or per head)
    carried state:       S0_r = sum_{j < r} (prod_{j < i < r} D_i) F_j  =  D_{r-1} S0_{r-1} + F_{r-1}, S0_0 = 0
    output:              o_t = o_t^0 + scale (q_t * exp(G_t))^T S0_r,   G_t = sum_{s <= t in slice} g_s

One all_gather of (F_r, D_r) replaces the sequential hand-over; it is differentiable (its backward sums each
rank's gradient contributions back to the rank that owns the slice), so gradients of every rank's q, k, v, g equal
the unsplit sequence's. The local runs use any implementation of `gated` (FLA's kernels on CUDA).

Delta rule (delta_rule_cp): S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T is affine in its initial
state too, S_end = A_r S_0 + F_r, but its transition A_r = prod_t a_t (I - beta_t k_t k_t^T) is a full K x K
matrix and the correction of each output needs the product up to that token. So each rank runs its slice twice:

    pass 1, from S = [I | 0] with values [0 | v]:   the state ends as [A_r | F_r]   (one run, values K + V wide)
    carried state:   S0_r = A_{r-1} S0_{r-1} + F_{r-1},  S0_0 = 0                 (one all_gather of (A, F))
    pass 2, from S0_r with the real values:           o_t, exact

Gated Oja rule (oja_cp): S_t = S_{t-1} diag(exp(gv_t)) (I - beta_t v_t v_t^T) + beta_t k_t v_t^T acts on the value
side, S_end = S_0 A_r + F_r with A_r a V x V matrix; each row of S evolves on its own. So pass 1 stacks V identity
rows over a zero state, their keys and queries zero: the state ends as [A_r ; F_r]. Then S0_r = S0_{r-1} A_{r-1} +
F_{r-1}, and pass 2 runs from it, as for the delta rule.

Packed documents (cu_seqlens in the slice's coordinates, kernels/varlen.py: slice_boundaries): a document start is a
gate that forgets everything. Each rank runs its documents as FLA's varlen kernels do; only its first document
(the leading `carried` tokens, 0 when a document starts at the slice's first token) continues the state handed
over, and a slice holding a boundary hands over its last document's state alone (D_r = 0, A_r = 0).

The collectives (gather) are kernels/cp.py's, shared with attention's form and the model's.
"""

from __future__ import annotations

import torch

from ..attention.reference import cumulative_log_decay
from ..cp import hand_over
from ..varlen import carried


def initial_states(S, n, cu):
    """The second pass's initial state of each run: the handed-over S for batch rows; over packed documents (cu) the
    first document continues S unless one starts at the slice's first token (n = 0 carried tokens), the others
    start from 0."""
    if cu is None:
        return S
    return torch.cat([S * (n > 0), S.new_zeros(len(cu) - 2, *S.shape[1:])])


def delta_rule_cp(q, k, v, beta, scale, g=None, group=None, impl: str | None = None, cu_seqlens=None):
    """This rank's slice of o for the (gated) delta rule over the whole sequence split across `group` (the default
    group when None). q, k [B, T_r, H, K], v [B, T_r, H, V], beta and g [B, T_r, H] (g: log decay, or None);
    cu_seqlens: packed documents (B = 1) in the slice's coordinates."""
    import torch.distributed as dist

    from . import delta_rule
    group = group or dist.group.WORLD
    B, T, H, K = k.shape
    cu = None if cu_seqlens is None else cu_seqlens.clamp(min=0)
    N = 1 if cu is None else len(cu) - 1  # runs: the batch rows, or the documents of a packed row
    dt = torch.promote_types(q.dtype, torch.float32)  # the state is kept in fp32 at least
    eye = torch.eye(K, dtype=dt, device=q.device).expand(max(B, N), H, K, K)
    S0 = torch.cat([eye, eye.new_zeros(max(B, N), H, K, v.shape[-1])], -1)
    _, end = delta_rule(q, k, torch.cat([v.new_zeros(B, T, H, K), v], -1), beta, scale, g, S0=S0,
                        output_state=True, cu_seqlens=cu, impl=impl)
    end = end[-B:]  # a packed row hands over its last document's state
    n = carried(cu_seqlens, T).to(q.device)
    transition = end[..., :K].to(dt) * (n == T)  # a boundary inside the slice: nothing before it passes through
    S = hand_over(transition, end[..., K:].to(dt), group, torch.matmul)
    return delta_rule(q, k, v, beta, scale, g, S0=initial_states(S, n, cu), cu_seqlens=cu, impl=impl)[0]


def gated_cp(q, k, v, g, scale, group=None, impl: str | None = None, cu_seqlens=None):
    """This rank's slice of o for the gated recurrence over the whole sequence split across `group` (the default
    group when None). q, k [B, T_r, H, K], v [B, T_r, H, V], g [B, T_r, H, K] or [B, T_r, H, 1] (log gate);
    cu_seqlens: packed documents (B = 1) in the slice's coordinates."""
    import torch.distributed as dist

    from . import gated
    group = group or dist.group.WORLD
    T = q.shape[1]
    cu = None if cu_seqlens is None else cu_seqlens.clamp(min=0)
    o, final = gated(q, k, v, g, scale, None, True, cu_seqlens=cu, impl=impl)
    final = final[-q.shape[0]:]  # a packed row hands over its last document's state
    dt = torch.promote_types(q.dtype, torch.float32)  # the hand-over in at least fp32, as the state is kept
    # [B, T_r, H, K or 1], summed along a transposed view's last axis: torch's cumsum over the time axis made each
    # rank 3.4x slower than one GPU per token at 370m (H200, 2026-11-26: a scan over 393k tokens; 1.3-1.4x after)
    G = cumulative_log_decay(g).to(dt)
    decay = torch.exp(G[:, -1])  # [B, H, K or 1]
    if cu is not None:  # a document start forgets everything before it: the carried state reaches the first document
        n = carried(cu_seqlens, T).to(q.device)
        decay = decay * (n == T)
        G = G.masked_fill(torch.arange(T, device=q.device)[None, :, None, None] >= n, float("-inf"))
    S0 = hand_over(decay, final.to(dt), group, lambda D, S: D[..., None] * S)  # D [B, H, K or 1], S [B, H, K, V]
    # in q's dtype (bf16 under autocast, where the einsum ran in bf16 anyway): no fp32 copies of q, o and their sum,
    # each [B, T_r, H, K or V] (1.6-3.2 GB a layer at 786k tokens a rank)
    carried_out = torch.einsum("bthk,bhkv->bthv", q * torch.exp(G).to(q.dtype), S0.to(q.dtype)) * scale
    return o + carried_out.to(o.dtype)


def oja_cp(q, k, v, gv, beta, scale, group=None, impl: str | None = None, cu_seqlens=None):
    """This rank's slice of o for the gated Oja rule over the whole sequence split across `group` (the default group
    when None). q, k [B, T_r, H, K], v and gv [B, T_r, H, V], beta [B, T_r, H]; cu_seqlens: packed documents (B = 1)
    in the slice's coordinates."""
    import torch.distributed as dist

    from . import oja
    group = group or dist.group.WORLD
    B, T, H, K = k.shape
    V = v.shape[-1]
    cu = None if cu_seqlens is None else cu_seqlens.clamp(min=0)
    N = 1 if cu is None else len(cu) - 1
    dt = torch.promote_types(q.dtype, torch.float32)
    eye = torch.eye(V, dtype=dt, device=q.device).expand(max(B, N), H, V, V)
    S0 = torch.cat([eye, eye.new_zeros(max(B, N), H, K, V)], 2)  # [A ; F] rows: V + K
    z = q.new_zeros(B, T, H, V)
    _, end = oja(torch.cat([z, q], -1), torch.cat([z, k], -1), v, gv, beta, scale, S0=S0, output_state=True,
                 cu_seqlens=cu, impl=impl)
    end = end[-B:].to(dt)  # a packed row hands over its last document's state
    n = carried(cu_seqlens, T).to(q.device)
    # a boundary inside the slice: nothing passes through; the transition acts from the right (value side)
    S = hand_over(end[..., :V, :] * (n == T), end[..., V:, :], group, lambda A, S: S @ A)
    return oja(q, k, v, gv, beta, scale, S0=initial_states(S, n, cu), cu_seqlens=cu, impl=impl)[0]
