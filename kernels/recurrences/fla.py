"""The recurrences through flash-linear-attention's chunked Triton kernels (CUDA), packed documents through its varlen
kernels. Imported on first use: FLA needs a GPU build of Triton."""

from __future__ import annotations

import torch


def gated(q, k, v, g, scale, S0=None, output_state=False, cu_seqlens=None):
    if g.shape[-1] == 1:  # a scalar gate per head: the simple-GLA kernel
        from fla.ops.simple_gla import chunk_simple_gla
        return chunk_simple_gla(q, k, v, g=g[..., 0].float(), scale=scale, initial_state=S0,
                                output_final_state=output_state, cu_seqlens=cu_seqlens)
    from fla.ops.gla import chunk_gla
    return chunk_gla(q, k, v, g=g.float(), scale=scale, initial_state=S0, output_final_state=output_state,
                     cu_seqlens=cu_seqlens)


def delta_rule(q, k, v, beta, scale, g=None, S0=None, output_state=False, cu_seqlens=None):
    if g is None and q.dtype != torch.float32:
        from fla.ops.delta_rule import chunk_delta_rule
        return chunk_delta_rule(q, k, v, beta=beta, scale=scale, initial_state=S0, output_final_state=output_state,
                                cu_seqlens=cu_seqlens)
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    if g is None:  # FLA 0.6's chunk_delta_rule refuses float32 (an fp32 run of DeltaNet): the gated one, g = 0
        g = q.new_zeros(q.shape[:3])
    return chunk_gated_delta_rule(q, k, v, g=g.float(), beta=beta, scale=scale, initial_state=S0,
                                  output_final_state=output_state, cu_seqlens=cu_seqlens)


def oja(q, k, v, gv, beta, scale, S0=None, output_state=False, cu_seqlens=None):
    from fla.ops.gated_oja_rule import chunk_gated_oja_rule
    return chunk_gated_oja_rule(q, k, v, gv=gv.float(), beta=beta, scale=scale, initial_state=S0,
                                output_final_state=output_state, cu_seqlens=cu_seqlens)
