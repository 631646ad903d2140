"""The recurrences through flash-linear-attention's chunked Triton kernels (CUDA), packed documents through its varlen
kernels. Imported on first use: FLA needs a GPU build of Triton.

GLA (a gate per channel) runs FLA's kernels but one: its backward's value gradient is gla_dv.py's (the same formula,
its intra-chunk product on tensor cores: 4.4 ms, 2.2%, of a 370m step on an H200, docs/throughput). DUALITY_GLA_DV=fla
in the environment puts FLA's own chunk_gla back, for comparison; so does an FLA other than the one _GLA calls the
internals of (pyproject pins it), with a warning, rather than fail inside a backward."""

from __future__ import annotations

import functools
import os
import warnings

import torch

FLA_INTERNALS = "0.6.0"  # the FLA whose private chunk_gla_* functions _GLA calls, in its chunk_gla_bwd's order


def gated(q, k, v, g, scale, S0=None, output_state=False, cu_seqlens=None):
    if g.shape[-1] == 1:  # a scalar gate per head: the simple-GLA kernel
        from fla.ops.simple_gla import chunk_simple_gla
        return chunk_simple_gla(q, k, v, g=g[..., 0].float(), scale=scale, initial_state=S0,
                                output_final_state=output_state, cu_seqlens=cu_seqlens)
    if os.environ.get("DUALITY_GLA_DV") == "fla":
        return _flas_chunk_gla(q, k, v, g, scale, S0, output_state, cu_seqlens)
    return _chunk_gla(q, k, v, g, scale, S0, output_state, cu_seqlens)


def _flas_chunk_gla(q, k, v, g, scale, S0, output_state, cu_seqlens):
    from fla.ops.gla import chunk_gla
    return chunk_gla(q, k, v, g=g.float(), scale=scale, initial_state=S0, output_final_state=output_state,
                     cu_seqlens=cu_seqlens)


@functools.cache
def fla_is_the_pinned_one() -> bool:
    """Whether the installed FLA is the one _GLA was written against (a warning, once, when not)."""
    import fla
    if fla.__version__ == FLA_INTERNALS:
        return True
    warnings.warn(f"flash-linear-attention {fla.__version__} is not {FLA_INTERNALS}, whose GLA internals "
                  "kernels/recurrences/fla.py calls: GLA runs FLA's own chunk_gla (without gla_dv.py's value gradient)",
                  stacklevel=2)
    return False


@torch.compiler.disable  # Triton kernels with FLA's autotuning: outside the graph, as FLA's chunk_gla is
def _chunk_gla(q, k, v, g, scale, S0, output_state, cu_seqlens):
    if not fla_is_the_pinned_one():  # (eager, so the check and its warning run once, outside any graph)
        return _flas_chunk_gla(q, k, v, g, scale, S0, output_state, cu_seqlens)
    q, k, v, g = (x.contiguous() for x in (q, k, v, g.float()))
    return _GLA.apply(q, k, v, g, scale, S0, output_state, cu_seqlens)


class _GLA(torch.autograd.Function):
    """FLA 0.6's chunked GLA (its functions, in the order of its chunk_gla_bwd), the value gradient from gla_dv.py.
    As FLA does for an fp32 gate, the forward keeps the chunk-local cumulative gate G rather than recomputing it."""

    @staticmethod
    def forward(ctx, q, k, v, g, scale, S0, output_state, cu_seqlens):
        import triton
        from fla.ops.gla.chunk import chunk_gla_fwd
        from fla.ops.utils import prepare_chunk_indices
        C = min(64, max(16, triton.next_power_of_2(q.shape[1])))
        chunks = None if cu_seqlens is None else prepare_chunk_indices(cu_seqlens, C)
        G, A, _, S, o = chunk_gla_fwd(q=q, k=k, v=v, g=g, g_cumsum=None, scale=scale, initial_state=S0,
                                      output_final_state=output_state, cu_seqlens=cu_seqlens, chunk_size=C,
                                      chunk_indices=chunks)
        ctx.save_for_backward(q, k, v, G, A, S0, cu_seqlens, chunks)
        ctx.scale, ctx.C = scale, C
        return o, S

    @staticmethod
    def backward(ctx, do, dS):
        from fla.ops.common.chunk_h import chunk_bwd_dh, chunk_fwd_h
        from fla.ops.gla.chunk import chunk_gla_bwd_dA, chunk_gla_bwd_dqk_intra, chunk_gla_bwd_dqkg

        from .gla_dv import gla_bwd_dv
        q, k, v, G, A, S0, cu, chunks = ctx.saved_tensors
        scale, C = ctx.scale, ctx.C
        do = do.contiguous()
        pieces = dict(cu_seqlens=cu, chunk_size=C)
        h, _ = chunk_fwd_h(k=k, v=v, gk=G, h0=S0, states_in_fp32=True, **pieces)
        dh, dS0 = chunk_bwd_dh(q=q, k=k, v=v, gk=G, do=do, h0=S0, dht=dS, scale=scale, states_in_fp32=True, **pieces)
        dv = gla_bwd_dv(k, G, A, do, dh, chunk_indices=chunks, **pieces)
        dA = chunk_gla_bwd_dA(v=v, do=do, scale=scale, chunk_indices=chunks, **pieces)
        dq, dk = chunk_gla_bwd_dqk_intra(q=q, k=k, g=G, dA=dA, chunk_indices=chunks, **pieces)
        dq, dk, dg = chunk_gla_bwd_dqkg(q=q, k=k, v=v, h=h, g=G, do=do, dh=dh, dq=dq, dk=dk, scale=scale,
                                        chunk_indices=chunks, **pieces)
        return dq.to(q), dk.to(k), dv.to(v), dg, None, dS0, None, None


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


# Decoding: FLA's fused recurrent kernels, one launch for the whole step (state in fp32, [B, H, K, V] as the chunked
# kernels keep it). They index q, k and v as contiguous [B, T, H, D].
def _c(*xs):
    return [None if x is None else x.contiguous() for x in xs]


def gated_step(q, k, v, g, scale, S0):
    q, k, v = _c(q, k, v)
    if g.shape[-1] == 1:
        from fla.ops.simple_gla import fused_recurrent_simple_gla
        return fused_recurrent_simple_gla(q, k, v, g=g[..., 0].float().contiguous(), scale=scale, initial_state=S0,
                                          output_final_state=True)
    from fla.ops.gla import fused_recurrent_gla
    return fused_recurrent_gla(q, k, v, gk=g.float().contiguous(), scale=scale, initial_state=S0,
                               output_final_state=True)


def delta_rule_step(q, k, v, beta, scale, g=None, S0=None):
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    q, k, v, beta, g = _c(q, k, v, beta, None if g is None else g.float())
    return fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, scale=scale, initial_state=S0,
                                            output_final_state=True)


def oja_step(q, k, v, gv, beta, scale, S0):
    from fla.ops.gated_oja_rule import fused_recurrent_gated_oja_rule
    q, k, v, gv, beta = _c(q, k, v, gv.float(), beta)
    return fused_recurrent_gated_oja_rule(q, k, v, gv=gv, beta=beta, scale=scale, initial_state=S0,
                                          output_final_state=True)


def delta_rule_step_fused(q, k, v, b, a, scale, S0, beta_max: float = 1.0, A_log=None, dt_bias=None):
    """delta_rule_step from the mixer's raw inputs, the rest inside FLA's kernel: q and k L2-normalised (eps 1e-6,
    as model/core/layers.py's l2norm), beta = beta_max sigmoid(b) (beta_max 2: allow_neg_eigval), and with A_log
    the decay g = -exp(A_log) softplus(a + dt_bias) (ScalarDecay); a None: no decay (DeltaNet)."""
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    q, k, v, b = _c(q, k, v, b)
    gated = A_log is not None
    return fused_recurrent_gated_delta_rule(
        q, k, v, g=a.contiguous() if gated else None, beta=b, scale=scale, initial_state=S0, output_final_state=True,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=gated, A_log=A_log, dt_bias=dt_bias,
        use_beta_sigmoid_in_kernel=True, allow_neg_eigval=beta_max == 2.0)
