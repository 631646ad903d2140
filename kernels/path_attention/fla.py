"""PaTH attention through flash-linear-attention's `parallel_path_attn` (CUDA).

FLA 0.6.0's PaTH backward faults (an illegal memory access in `intra_chunk_preprocess_bwd_kernel`) on an H200 for
heads of 32 (seen at T 128 and 129, gated or not, 256 or 8 sequences); heads of 64 ran clean at both lengths
(reproductions/path_fault.py, docs/gpu/path_fault_h200_2026-11-29.json). So heads smaller than `MIN_HEAD` are padded
with zeros to it, which is exact: a zero coordinate adds nothing to q.k or to w's norm, H_s = I - beta w w^T leaves it
zero, and the padded value coordinates come out zero and are cut off. The scale stays the unpadded head's.
"""

from __future__ import annotations

import torch.nn.functional as F

MIN_HEAD = 64


def pad_heads(q, k, v, w, size: int = MIN_HEAD):
    """q, k, v, w [B, T, H, D]: each zero-padded to `size` in its last dimension where that is smaller."""
    return tuple(F.pad(x, (0, size - x.shape[-1])) if x.shape[-1] < size else x for x in (q, k, v, w))


def path_attention(q, k, v, w, beta, log_gate, scale):
    from fla.ops.path_attn import parallel_path_attn
    d = v.shape[-1]
    q, k, v, w = pad_heads(q, k, v, w)
    g = None if log_gate is None else (log_gate.float() / scale)  # FLA scales the gate term by the attention scale
    o, _ = parallel_path_attn(q, k, v, w.float(), beta.float(), g, scale=scale)
    return o[..., :d]
