"""PaTH attention: softmax attention whose position encoding is an accumulated product of Householder-like
transforms H_s = I - beta_s w_s w_s^T (the dual of DeltaNet's transition, seed 000 section 5):

    score_ij = scale * k_j^T (H_{j+1} H_{j+2} ... H_i) q_i  +  (c_i - c_j)          j <= i
    o_i      = sum_j softmax_j(score_ij) v_j

with the optional FoX log-decay c (PaTH-FoX, the dual of Gated DeltaNet). H_s is symmetric, so the same product
moves keys forward: the decoding cache stores k~_j = H_t ... H_{j+1} k_j and updates it by H_t at each new token.

`path_attention_reference` computes all scores in T sweeps (sweep d applies H_{i-d+1} to every query at once and
reads the score of key i-d), O(T^2 D) work in O(T D) memory per sweep. `path_attention` dispatches to FLA's
`parallel_path_attn` on CUDA. FLA scales its gate term by the attention scale; we keep the gate unscaled (as FoX
and ALiBi), so we hand FLA g / scale.
"""

from __future__ import annotations

import math

import torch

from .attention import cumulative_log_decay


def householder(x, w, beta):
    """(I - beta w w^T) x, batched over leading dims: x, w [..., D], beta [...]."""
    return x - beta[..., None] * (w * x).sum(-1, keepdim=True) * w


def path_scores(q, k, w, beta):
    """Raw PaTH scores k_j^T prod_{s=j+1..i} H_s q_i, [B, H, T, T] (zero above the diagonal)."""
    B, T, H, D = q.shape
    scores = q.new_zeros(B, H, T, T)
    u = q.clone()  # u_i = H_{i-d+1} ... H_i q_i at sweep d
    idx = torch.arange(T, device=q.device)
    for d in range(T):
        i = idx[d:]
        if d > 0:
            s = i - d + 1  # the transform entered at this sweep, for query i
            u = torch.cat([u[:, :d], householder(u[:, d:], w[:, s], beta[:, s])], 1)
        scores[:, :, i, i - d] = torch.einsum("bthd,bthd->bht", u[:, d:], k[:, i - d])
    return scores


def path_attention_reference(q, k, v, w, beta, log_decay=None, scale=None):
    out_dtype = q.dtype
    dt = torch.promote_types(q.dtype, torch.float32)
    q, k, v, w, beta = (t.to(dt) for t in (q, k, v, w, beta))
    B, T, H, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = path_scores(q, k, w, beta) * scale
    if log_decay is not None:
        c = log_decay.transpose(1, 2)
        s = s + c[..., :, None] - c[..., None, :]
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(s, -1), v).to(out_dtype)


def path_attention(q, k, v, w, beta, log_gate=None, scale=None):
    """log_gate: per-token log forget gate [B, T, H] (its cumulative sum is the FoX log-decay), or None."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if q.is_cuda:
        from fla.ops.path_attn import parallel_path_attn
        g = None if log_gate is None else (log_gate.float() / scale)
        o, _ = parallel_path_attn(q, k, v, w.float(), beta.float(), g, scale=scale)
        return o
    c = None if log_gate is None else cumulative_log_decay(log_gate)
    return path_attention_reference(q, k, v, w, beta, c, scale)
