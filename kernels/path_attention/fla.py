"""PaTH attention through flash-linear-attention's `parallel_path_attn` (CUDA)."""

from __future__ import annotations


def path_attention(q, k, v, w, beta, log_gate, scale):
    from fla.ops.path_attn import parallel_path_attn
    g = None if log_gate is None else (log_gate.float() / scale)  # FLA scales the gate term by the attention scale
    o, _ = parallel_path_attn(q, k, v, w.float(), beta.float(), g, scale=scale)
    return o
