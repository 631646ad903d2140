"""Decayed attention: the one causal attention primitive behind every additive positional scheme and forget gate.

    o_i = sum_{j <= i} w_ij v_j / sum_{j <= i} w_ij,        s_ij = scale * q_i . k_j
    softmax      (power=None):  w_ij = exp(s_ij + (c_i - c_j) - m_h (i - j) + b_ij)
    symmetric power p (even):   w_ij = s_ij^p  exp((c_i - c_j) - m_h (i - j))                          (seed 003)

- c is a cumulative log-decay, c_t = sum_{s <= t} log a_s with a_s in (0, 1]: the forget gate of a linear
  recurrence written in log space (seed 000). FoX: log a_t = log sigmoid(w . x_t + b); sympow + gating: the same
  gate multiplying (q.k)^p; NoPE: no c.
- `slopes` m_h: ALiBi, the constant gate log a = -m_h, given as slopes so that -m_h (i - j) is computed from the
  positions (a cumulative sum -m_h t, rounded to fp32 at t ~ 10^4, would blur nearby weights).
- b is any other additive term (T5 buckets, Transformer-XL's position terms), broadcastable to [B, H, Tq, Tk].
- p even keeps every w_ij >= 0, so each row is a distribution; the scale cancels between numerator and denominator
  and only keeps s^p in range. c_i cancels the same way: only the key side c_j shapes the weights, and the gradient
  reaching c_i from row i is zero (in exact arithmetic: the kernel adds it anyway, see _dq_kernel).

Layout: q [B, Tq, H, D], k and v [B, Tk, H, D] with Tq <= Tk; the queries are the last Tq positions of the Tk keys
(so the same call serves training, chunked prefill and one-token decoding with a KV cache). `log_decay` is c at the
Tk key positions, [B, Tk, H] (the queries use its last Tq entries). `cu_seqlens` [N + 1] marks the documents of a
packed batch (B = 1, Tq = Tk): no token attends across a boundary.

Three implementations of the same function:
- `decayed_attention_reference` (reference.py, beside the SDPA path): the formula with explicit T x T scores (CPU
  path for sympow, test oracle).
- a flash-style Triton kernel (kernel.py), forward and backward, memory linear in T: each program holds a block of
  queries (or, in the backward, of keys) and streams the other side through on-chip memory. The softmax path keeps
  the online max (exp2 with log2 e folded in); the power path needs no exponent and no running max: s^p is a
  product, an fp32 accumulator holds it for |s| up to ~10^9, and bf16 (the operand of the p.v product) has fp32's
  range. Away from the diagonal the power path's gate factorises, exp(c_i - c_j) = exp(c_i - c_r) exp(c_r - c_j)
  with r the block's last key (both factors <= 1), so it costs one multiply per score instead of an exponential. The
  interpreter runs the kernel on a CPU when TRITON_INTERPRET=1 (how CI tests it).
- `cached_attention`: queries at a position given as a tensor against a fixed buffer of keys, those not yet written
  masked: the decoding step's form at one shape for every position (model/decode.py). One query on CUDA: decode.py's
  split-key kernel; else `cached_attention_reference` (SDPA with a mask over the buffer, or the power formula).
- `decayed_attention`: the entry point. On CUDA the Triton kernel whenever there is a gate, slopes, a power or
  packed documents; plain causal softmax goes to torch's SDPA (cuDNN / FlashAttention); elsewhere the reference or
  SDPA with an explicit mask.
"""

from __future__ import annotations

import math

import torch

from .decode import decode_attention, decode_ok
from .kernel import CONFIG, INTERPRETER_CONFIG, _fused, _triton_ok
from .reference import (
    _check,
    _sdpa,
    cached_attention_reference,
    cumulative_log_decay,
    decayed_attention_reference,
    log_weight_bias,
)

__all__ = ["CONFIG", "INTERPRETER_CONFIG", "cached_attention", "cached_attention_reference", "cumulative_log_decay",
           "decayed_attention", "decayed_attention_reference", "log_weight_bias"]


def decayed_attention(q, k, v, *, log_decay=None, slopes=None, bias=None, power=None, scale=None, cu_seqlens=None,
                      impl: str | None = None):
    """o [B, Tq, H, D]; see the module docstring. log_decay: c [B, Tk, H]; slopes: ALiBi's m [H]; bias: b_ij
    broadcastable to [B, H, Tq, Tk] (softmax only, not in the kernel); power: None (softmax) or an even p;
    scale: default 1/sqrt(D); cu_seqlens: document boundaries of packed input (B = 1).
    impl: "triton", "torch", or default: the Triton kernel on CUDA when it applies and beats SDPA (any gate, slopes,
    power or packing, Tq = Tk, no bias, D in 16/32/64/128), SDPA for plain causal softmax, the reference for the
    power path elsewhere."""
    _check(q, k, v, log_decay, slopes, power, cu_seqlens)
    if power is not None and bias is not None:
        raise ValueError("decayed_attention: an additive bias b_ij needs softmax scores (power=None)")
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if impl is None:
        special = log_decay is not None or slopes is not None or power is not None or cu_seqlens is not None
        impl = "triton" if special and _triton_ok(q, k, bias) else "torch"
    if impl == "triton":
        if not _triton_ok(q, k, bias, interpreter=True):
            raise ValueError("decayed_attention: impl='triton' needs CUDA (or TRITON_INTERPRET=1), Tq = Tk, no bias, "
                             f"D in 16/32/64/128 and a fp32/bf16/fp16 dtype; got D={D}, {q.dtype}, Tq={q.shape[1]}, "
                             f"Tk={k.shape[1]}, bias={'yes' if bias is not None else 'no'}")
        c = None if log_decay is None else log_decay.expand(q.shape[0], -1, -1)
        return _fused(q, k, v, c, slopes, power, scale, cu_seqlens)
    if impl != "torch":
        raise ValueError(f"decayed_attention: impl must be 'triton' or 'torch', got {impl!r}")
    if power is not None:  # explicit scores, in fp32 at least (s^p and exp(c_i - c_j))
        dt = torch.promote_types(q.dtype, torch.float32)
        o = decayed_attention_reference(q.to(dt), k.to(dt), v.to(dt), log_decay=log_decay, slopes=slopes,
                                        power=power, scale=scale, cu_seqlens=cu_seqlens)
        return o.to(q.dtype)
    return _sdpa(q, k, v, log_decay, slopes, bias, scale, cu_seqlens)


def cached_attention(q, k, v, offset, *, log_decay=None, slopes=None, bias=None, power=None, scale=None,
                     impl: str | None = None):
    """Queries at positions offset .. offset+Tq-1 (offset a 0-d tensor) against a fixed buffer of keys, those past
    each query masked (reference.py: cached_attention_reference). impl: "triton" (decode.py's kernel: one query,
    softmax, no bias), "torch", or default: the kernel where it applies on CUDA."""
    if impl is None:
        impl = "triton" if q.is_cuda and decode_ok(q, k, power, bias) else "torch"
    if impl == "triton":
        if not decode_ok(q, k, power, bias):
            raise ValueError("cached_attention: impl='triton' needs one query, softmax scores without a bias, D in "
                             "16/32/64/128, and CUDA or TRITON_INTERPRET=1")
        return decode_attention(q, k, v, offset, log_decay=log_decay, slopes=slopes, scale=scale)
    if impl != "torch":
        raise ValueError(f"cached_attention: impl must be 'triton' or 'torch', got {impl!r}")
    return cached_attention_reference(q, k, v, offset, log_decay=log_decay, slopes=slopes, bias=bias, power=power,
                                      scale=scale)
