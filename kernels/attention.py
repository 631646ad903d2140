"""Decayed softmax attention: the one primitive behind every additive positional scheme.

    o_i = sum_{j <= i} softmax_j( scale * q_i . k_j + (c_i - c_j) + b_ij ) v_j

- c is a cumulative log-decay, c_t = sum_{s <= t} log a_s with a_s in (0, 1]: the forget gate of a linear
  recurrence written in log space (seed 000). ALiBi is the constant gate log a = -m_h (so c_i - c_j = -m_h (i - j));
  FoX is the data-dependent gate log a_t = log sigmoid(w . x_t + b). NoPE is a = 1.
- b is any other additive term (T5 buckets, Transformer-XL's position terms), shape broadcastable to [B, H, Tq, Tk].

Layout: q [B, Tq, H, D], k and v [B, Tk, H, D] with Tq <= Tk; the queries are the last Tq positions of the Tk keys
(so the same call serves training, chunked prefill and one-token decoding with a KV cache). `log_decay` is c at the
Tk key positions, [B, Tk, H]; the queries use its last Tq entries.

`decayed_attention` runs through torch's scaled_dot_product_attention (flash / cuDNN kernels when there is no bias);
`decayed_attention_reference` is the formula written out, used as the oracle in tests (float64 on CPU).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _additive_bias(Tq, Tk, H, log_decay, bias, device, dtype):
    """scale-free additive term (c_i - c_j) + b_ij with -inf above the causal diagonal: [B or 1, H, Tq, Tk]."""
    i = torch.arange(Tk - Tq, Tk, device=device)[:, None]
    j = torch.arange(Tk, device=device)[None, :]
    out = torch.zeros(1, 1, Tq, Tk, device=device, dtype=dtype)
    if log_decay is not None:
        c = log_decay.to(dtype).transpose(1, 2)  # [B, H, Tk]
        out = out + (c[:, :, Tk - Tq:, None] - c[:, :, None, :])
    if bias is not None:
        out = out + bias.to(dtype)
    return out.masked_fill(j > i, float("-inf"))


def varying_shapes():
    """A context for inference whose shapes change call after call (scoring batches of other lengths, decoding with
    a growing KV cache): torch's SDPA without the cuDNN backend, which builds (~50 ms) and caches an execution plan
    per new shape. Training, at one shape, keeps cuDNN."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def decayed_attention(q, k, v, *, log_decay=None, bias=None, scale=None):
    B, Tq, H, D = q.shape
    Tk = k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    if log_decay is None and bias is None:
        if Tq == Tk:
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
        elif Tq == 1:  # one new token sees the whole cache
            o = F.scaled_dot_product_attention(qh, kh, vh, scale=scale)
        else:
            i = torch.arange(Tk - Tq, Tk, device=q.device)[:, None]
            mask = torch.arange(Tk, device=q.device)[None, :] <= i
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    else:
        # c_i - c_j is a small difference of large numbers at long T, and a bf16 bias would round -m*1000 by
        # several units: keep the bias, and so (SDPA wants one dtype) the whole call, in at least fp32.
        # The fused decayed-attention kernel (issue #5) removes this cost.
        dtype = torch.promote_types(q.dtype, torch.float32)
        mask = _additive_bias(Tq, Tk, H, log_decay, bias, q.device, dtype)
        o = F.scaled_dot_product_attention(qh.to(dtype), kh.to(dtype), vh.to(dtype), attn_mask=mask, scale=scale)
        o = o.to(q.dtype)
    return o.transpose(1, 2)


def decayed_attention_reference(q, k, v, *, log_decay=None, bias=None, scale=None):
    """Plain formula (explicit scores, softmax, weighted sum) in the dtype of q."""
    B, Tq, H, D = q.shape
    Tk = k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    s = s + _additive_bias(Tq, Tk, H, log_decay, bias, q.device, q.dtype)
    p = torch.softmax(s, dim=-1)
    return torch.einsum("bhij,bjhd->bihd", p, v)
