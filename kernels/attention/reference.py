"""Decayed attention from its formula (kernels/attention/__init__.py): the reference with explicit scores (the
power path off CUDA, the oracle of the kernel) and softmax through torch's SDPA."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from ..varlen import document_ids


def cumulative_log_decay(log_gate: torch.Tensor) -> torch.Tensor:
    """c_t = sum_{s<=t} f_s: the log-decay of per-token log forget gates f [B, T, H] (or [B, T, H, K]), in fp32 at
    least. Summed along the last axis of a transposed view: torch's cumsum over the middle (time) axis of a
    [4, 4096, 16] tensor took 1.5 ms forward on an H100, this 0.03 ms (and is closer to float64)."""
    x = log_gate.to(torch.promote_types(log_gate.dtype, torch.float32))
    return torch.cumsum(x.transpose(1, -1), -1).transpose(1, -1)


def log_weight_bias(Tq, Tk, *, log_decay=None, slopes=None, bias=None, cu_seqlens=None, device=None,
                    dtype=torch.float32, q_pos=None):
    """The additive log-weight (c_i - c_j) - m_h (i - j) + b_ij, -inf where j > i or across documents:
    [B or 1, H or 1, Tq, Tk]. The queries are the last Tq keys, or at the positions q_pos [Tq] (a fixed buffer of
    keys, cached_attention)."""
    i = (torch.arange(Tk - Tq, Tk, device=device) if q_pos is None else q_pos)[:, None]
    j = torch.arange(Tk, device=device)[None, :]
    out = torch.zeros(1, 1, Tq, Tk, device=device, dtype=dtype)
    if log_decay is not None:
        c = log_decay.to(dtype).transpose(1, 2)  # [B, H, Tk]
        ci = c[:, :, Tk - Tq:] if q_pos is None else c.index_select(2, q_pos)
        out = out + (ci[..., None] - c[:, :, None, :])
    if slopes is not None:
        out = out - slopes.to(device=device, dtype=dtype)[None, :, None, None] * (i - j).to(dtype)
    if bias is not None:
        out = out + bias.to(dtype)
    allowed = j <= i
    if cu_seqlens is not None:
        doc = document_ids(cu_seqlens.to(device), Tk)
        allowed = allowed & (doc[Tk - Tq:, None] == doc[None, :])
    return out.masked_fill(~allowed, float("-inf"))


def _check(q, k, v, log_decay, slopes, power, cu_seqlens):
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[::2] != k.shape[::2] or q.shape[1] > k.shape[1] \
            or q.shape[3] != k.shape[3]:
        raise ValueError(f"decayed_attention: q [B, Tq, H, D] and k, v [B, Tk, H, D] with Tq <= Tk, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, Tk, H = k.shape[:3]
    if log_decay is not None and (log_decay.dim() != 3 or log_decay.shape[1:] != (Tk, H)
                                  or log_decay.shape[0] not in (1, B)):
        raise ValueError(f"decayed_attention: log_decay must be [B, Tk, H] = [{B}, {Tk}, {H}], "
                         f"got {tuple(log_decay.shape)}")
    if slopes is not None and slopes.shape != (H,):
        raise ValueError(f"decayed_attention: slopes must be [H] = [{H}], got {tuple(slopes.shape)}")
    if power is not None and (not isinstance(power, int) or power < 2 or power % 2):
        raise ValueError(f"decayed_attention: power must be an even integer >= 2 (or None for softmax), got {power!r}")
    if cu_seqlens is not None and (B != 1 or q.shape[1] != Tk):
        raise ValueError("decayed_attention: packed input (cu_seqlens) needs B = 1 and Tq = Tk")


def decayed_attention_reference(q, k, v, *, log_decay=None, slopes=None, bias=None, power=None, scale=None,
                                cu_seqlens=None):
    """Plain formula (explicit scores, normalised weights, weighted sum) in the dtype of q."""
    _check(q, k, v, log_decay, slopes, power, cu_seqlens)
    Tq, Tk, D = q.shape[1], k.shape[1], q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    a = log_weight_bias(Tq, Tk, log_decay=log_decay, slopes=slopes, bias=bias, cu_seqlens=cu_seqlens,
                        device=q.device, dtype=q.dtype)
    if power is None:
        p = torch.softmax(s + a, dim=-1)
    else:
        w = s ** power * torch.exp(a)
        p = w / w.sum(-1, keepdim=True)
    return torch.einsum("bhij,bjhd->bihd", p, v)


def _sdpa(q, k, v, log_decay, slopes, bias, scale, cu_seqlens):
    """Softmax through torch's SDPA (flash / cuDNN kernels when there is no additive term, else an explicit mask)."""
    Tq, Tk = q.shape[1], k.shape[1]
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    if log_decay is None and slopes is None and bias is None and cu_seqlens is None:
        if Tq == Tk:
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
        elif Tq == 1:  # one new token sees the whole cache
            o = F.scaled_dot_product_attention(qh, kh, vh, scale=scale)
        else:  # the queries are the last Tq keys: a causal mask aligned to the bottom right, which SDPA's flash
            # kernels take without a [Tq, Tk] mask in memory (chunked prefill, context parallelism)
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=causal_lower_right(Tq, Tk), scale=scale)
        return o.transpose(1, 2)
    # c_i - c_j is a small difference of large numbers at long T, and a bf16 bias would round -m*1000 by several
    # units: keep the bias, and so (SDPA wants one dtype) the whole call, in at least fp32.
    dtype = torch.promote_types(q.dtype, torch.float32)
    mask = log_weight_bias(Tq, Tk, log_decay=log_decay, slopes=slopes, bias=bias, cu_seqlens=cu_seqlens,
                           device=q.device, dtype=dtype)
    o = F.scaled_dot_product_attention(qh.to(dtype), kh.to(dtype), vh.to(dtype), attn_mask=mask, scale=scale)
    return o.to(q.dtype).transpose(1, 2)


def cached_attention_reference(q, k, v, offset, *, log_decay=None, slopes=None, bias=None, power=None, scale=None):
    """Decayed attention of queries at positions offset .. offset+Tq-1 (offset a 0-d tensor) against a fixed buffer
    of L keys at positions 0 .. L-1, those past each query not yet written (masked out): a KV-cache step at one
    shape whatever the position, so one CUDA graph replays every step (model/decode.py). Equal to
    decayed_attention over the buffer's first offset+Tq keys (tests/kernels/test_attention.py). Softmax through
    SDPA with a mask over the buffer, the power path from its formula."""
    if bias is not None:
        raise ValueError("cached_attention: an additive bias b_ij (T5, Transformer-XL) is built for the keys' "
                         "positions relative to the last query; decode those schemes with a growing cache")
    Tq, L = q.shape[1], k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    i = offset + torch.arange(Tq, device=q.device)
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    if power is None and log_decay is None and slopes is None:  # a boolean mask: SDPA in the model's dtype
        mask = torch.arange(L, device=q.device)[None, :] <= i[:, None]
        return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale).transpose(1, 2)
    dtype = torch.promote_types(q.dtype, torch.float32)  # as _sdpa: the bias of large c's differences in fp32
    a = log_weight_bias(Tq, L, log_decay=log_decay, slopes=slopes, device=q.device, dtype=dtype, q_pos=i)
    if power is None:
        o = F.scaled_dot_product_attention(qh.to(dtype), kh.to(dtype), vh.to(dtype), attn_mask=a, scale=scale)
        return o.to(q.dtype).transpose(1, 2)
    w = (torch.einsum("bhid,bhjd->bhij", qh.to(dtype), kh.to(dtype)) * scale) ** power * torch.exp(a)
    o = torch.einsum("bhij,bhjd->bihd", w / w.sum(-1, keepdim=True), vh.to(dtype))
    return o.to(q.dtype)
