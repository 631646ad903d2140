"""PaTH attention from its definition (kernels/path_attention/__init__.py): the CPU path and the oracle."""

from __future__ import annotations

import math

import torch


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
    # in fp32 (float64 for the oracle tests) even under autocast, which would run the einsums in bf16
    with torch.autocast(q.device.type, enabled=False):
        return _reference(q, k, v, w, beta, log_decay, scale)


def _reference(q, k, v, w, beta, log_decay, scale):
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
