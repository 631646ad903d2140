"""One query per row against a fixed buffer of keys: the decoding step of softmax attention (cached_attention's
Tq = 1 case on CUDA), split over the keys as flash-decoding does.

    o = sum_{j <= t} w_j v_j / sum_{j <= t} w_j,   w_j = exp(s_j - m),   s_j = scale q.k_j + (c_t - c_j) - m_h (t - j)

with t the query's position, read from a 0-d tensor on the device (so one CUDA graph serves every step), the keys
past t (not yet written) never read. Each program takes one (row, head) and one split of the buffer's positions,
loops over its keys up to t in blocks with the online softmax, and writes its partial (max, sum, weighted values);
the splits are combined afterwards. torch's SDPA with a mask over the buffer gives one program per (row, head) for
the whole buffer: 16 programs for a 370m model at batch 1, 239 us a layer at 4,096 keys on an H200 (79% of a
transformer's step, docs/inference.md). Triton's interpreter runs the kernel on a CPU (TRITON_INTERPRET=1), which is
how CI tests it against cached_attention's formula."""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference
    triton = None

BLOCK = 64  # keys a loop iteration loads
SM_TARGET = 264  # programs to aim for: two per multiprocessor of an H100 / H200


def decode_ok(q, k, power=None, bias=None) -> bool:
    """The kernel applies: one query, softmax, no bias, D in 16/32/64/128, on CUDA or Triton's interpreter."""
    where = q.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    return (triton is not None and where and q.shape[1] == 1 and power is None and bias is None
            and q.shape[-1] in (16, 32, 64, 128) and q.dtype in (torch.bfloat16, torch.float16, torch.float32))


if triton is not None:
    @triton.jit
    def _decode_kernel(q, k, v, c, slopes, offset, part_o, part_m, part_l, scale, L, H, SPLIT,
                       sqb, sqh, skb, skl, skh, svb, svl, svh, scb, scl,
                       D: tl.constexpr, BLOCK: tl.constexpr, HAS_C: tl.constexpr, HAS_SLOPES: tl.constexpr):
        bh, sp = tl.program_id(0), tl.program_id(1)
        b, h = bh // H, bh % H
        t = tl.load(offset).to(tl.int32)
        start = sp * SPLIT
        end = tl.minimum(start + SPLIT, t + 1)
        d = tl.arange(0, D)
        # (scale cast: under torch.compile a Python float reaches the kernel as fp64, which would make m fp64)
        qv = (tl.load(q + b * sqb + h * sqh + d).to(tl.float32) * scale).to(tl.float32)
        c_t = tl.load(c + b * scb + t * scl + h).to(tl.float32) if HAS_C else 0.0
        slope = tl.load(slopes + h).to(tl.float32) if HAS_SLOPES else 0.0
        m = tl.full((), float("-inf"), tl.float32)
        den = tl.zeros((), tl.float32)
        acc = tl.zeros((D,), tl.float32)
        for s in range(start, end, BLOCK):
            j = s + tl.arange(0, BLOCK)
            inside = j < end
            kk = tl.load(k + b * skb + j[:, None] * skl + h * skh + d[None, :], mask=inside[:, None], other=0.0)
            score = tl.sum(kk.to(tl.float32) * qv[None, :], 1)
            if HAS_C:
                score += c_t - tl.load(c + b * scb + j * scl + h, mask=inside, other=0.0).to(tl.float32)
            if HAS_SLOPES:
                score -= slope * (t - j).to(tl.float32)
            score = tl.where(inside, score, float("-inf"))
            m_new = tl.maximum(m, tl.max(score, 0))
            p = tl.exp(score - m_new)
            alpha = tl.exp(m - m_new)
            vv = tl.load(v + b * svb + j[:, None] * svl + h * svh + d[None, :], mask=inside[:, None], other=0.0)
            acc = acc * alpha + tl.sum(p[:, None] * vv.to(tl.float32), 0)
            den = den * alpha + tl.sum(p, 0)
            m = m_new
        n_split = tl.num_programs(1)
        tl.store(part_m + bh * n_split + sp, m)
        tl.store(part_l + bh * n_split + sp, den)
        tl.store(part_o + (bh * n_split + sp) * D + d, acc)


def decode_attention(q, k, v, offset, *, log_decay=None, slopes=None, scale=None):
    """q [B, 1, H, D] at position offset (a 0-d integer tensor) against k, v [B, L, H, D] (positions past offset
    not read); log_decay c [B, L, H] (FoX), slopes m [H] (ALiBi). Returns o [B, 1, H, D] in q's dtype."""
    B, L, H, D = k.shape
    scale = D ** -0.5 if scale is None else float(scale)
    n_split = max(1, min(triton.cdiv(L, BLOCK), SM_TARGET // (B * H)))
    split = triton.cdiv(triton.cdiv(L, n_split), BLOCK) * BLOCK
    n_split = triton.cdiv(L, split)
    part_o = torch.empty(B * H, n_split, D, device=q.device, dtype=torch.float32)
    part_m = torch.empty(B * H, n_split, device=q.device, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    c = log_decay if log_decay is not None else q
    _decode_kernel[(B * H, n_split)](
        q, k, v, c, slopes if slopes is not None else q, offset, part_o, part_m, part_l, scale, L, H, split,
        q.stride(0), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        c.stride(0) if log_decay is not None else 0, c.stride(1) if log_decay is not None else 0,
        D=D, BLOCK=BLOCK, HAS_C=log_decay is not None, HAS_SLOPES=slopes is not None)
    w = torch.exp(part_m - part_m.max(1, keepdim=True).values)  # splits past the position: m = -inf, weight 0
    o = (w[..., None] * part_o).sum(1) / (w * part_l).sum(1)[:, None]
    return o.view(B, H, D)[:, None].to(q.dtype)
