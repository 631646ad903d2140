"""The linear recurrences of the forget-gate side of the duality, with PyTorch references and FLA dispatch.

All use FLA's layout: q, k [B, T, H, K], v [B, T, H, V], state S [B, H, K, V], o_t = scale * S_t^T q_t.

    gated (GLA family)   S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T          g_t in R^K (log gate, <= 0)
                         a scalar gate per head is g_t broadcast over K (RetNet: constant, Mamba2: data dependent),
                         linear attention is g = 0.
    delta rule           S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T      (g = 0: DeltaNet)
    gated Oja (seed 001) S_t = (S_{t-1} diag(exp(gv_t))) (I - beta_t v_t v_t^T) + beta_t k_t v_t^T   (value side)

Unrolled, each is sum_j (k_j^T [prod_{s=j+1..t} A_s] q_t) v_j: the product of forget gates is the relative position
encoding that the dual softmax scheme puts into its scores (seed 000).

`*_recurrent` are the token-by-token definitions (the oracles, and the decoding step). `gated_chunked` and
`delta_rule_chunked` are exact chunked parallel forms (the CPU training path; gate differences are taken pairwise
inside chunks of 16, so they are stable).
`gated_step`, `delta_rule_step` and `oja_step` continue from a state for a few tokens (decoding): FLA's fused
recurrent kernels on CUDA (one launch a layer, where the reference's step is some ten), the references elsewhere.
`gated`, `delta_rule` and `oja` dispatch (impl=None: FLA on CUDA, the references elsewhere; "fla" or "torch" to
choose) and take packed documents (B = 1, boundaries cu_seqlens [N + 1]): document i starts from S0[i] (S = 0
without S0) and its final state is row i of [N, H, K, V]; FLA's varlen kernels on CUDA, the reference per document
elsewhere.

    reference.py   the recurrent and chunked forms, from the equations (and the value gradient of FLA's chunked
                   GLA backward)
    fla.py         flash-linear-attention's chunked kernels
    gla_dv.py      that value gradient on tensor cores, in place of FLA's kernel for it (DUALITY_GLA_DV=fla: FLA's)
    cp.py          context parallelism: the gated recurrence, the delta rule and the Oja rule over a sequence split
                   across ranks
                   (the state handed over in one all_gather; packed documents too; train.context_parallel)
"""

from __future__ import annotations

import torch

from .. import use_fla
from ..varlen import per_document
from . import fla
from .reference import delta_rule_chunked, delta_rule_recurrent, gated_chunked, gated_recurrent, oja_recurrent

__all__ = ["delta_rule", "delta_rule_chunked", "delta_rule_recurrent", "delta_rule_step", "gated", "gated_chunked",
           "gated_recurrent", "gated_step", "oja", "oja_recurrent", "oja_step"]


def _documents(chunked, cu_seqlens, S0, output_state, *args):
    """A reference over packed documents as FLA's varlen kernels take them: document i starts from S0[i] (S = 0
    when S0 is None) and its final state is row i of the states returned ([N, H, K, V], when output_state)."""
    if S0 is None and not output_state:  # no state in or out: one run per document
        return per_document(lambda *a: chunked(*a)[0], cu_seqlens, *args), None
    b = cu_seqlens.tolist()
    outs, finals = [], []
    for i, (s, e) in enumerate(zip(b[:-1], b[1:])):
        o, S = chunked(*(a[:, s:e] if torch.is_tensor(a) and a.dim() > 1 else a for a in args),
                       None if S0 is None else S0[i:i + 1])
        outs.append(o)
        finals.append(S)
    return torch.cat(outs, 1), torch.cat(finals) if output_state else None


def gated(q, k, v, g, scale, S0=None, output_state=False, cu_seqlens=None, impl: str | None = None):
    """g: [B, T, H, K] (diagonal gate) or [B, T, H, 1] (scalar gate per head), log space."""
    if use_fla("gated", q, impl):
        return fla.gated(q, k, v, g, scale, S0, output_state, cu_seqlens)
    if cu_seqlens is not None:
        return _documents(gated_chunked, cu_seqlens, S0, output_state, q, k, v,
                          g.expand(*q.shape[:3], g.shape[-1]), scale)
    return gated_chunked(q, k, v, g, scale, S0)


def delta_rule(q, k, v, beta, scale, g=None, S0=None, output_state=False, cu_seqlens=None, impl: str | None = None):
    """beta: [B, T, H]; g: [B, T, H] log decay (Gated DeltaNet) or None (DeltaNet)."""
    if use_fla("delta_rule", q, impl):
        return fla.delta_rule(q, k, v, beta, scale, g, S0, output_state, cu_seqlens)
    if cu_seqlens is not None:
        return _documents(delta_rule_chunked, cu_seqlens, S0, output_state, q, k, v, beta, scale, g)
    return delta_rule_chunked(q, k, v, beta, scale, g, S0)


def oja(q, k, v, gv, beta, scale, S0=None, output_state=False, cu_seqlens=None, impl: str | None = None):
    """gv: [B, T, H, V] log gate on the value side; beta: [B, T, H]."""
    if use_fla("oja", q, impl):
        return fla.oja(q, k, v, gv, beta, scale, S0, output_state, cu_seqlens)
    if cu_seqlens is not None:
        return _documents(oja_recurrent, cu_seqlens, S0, output_state, q, k, v, gv, beta, scale)
    return oja_recurrent(q, k, v, gv, beta, scale, S0)


# The decoding steps: the recurrences' definitions continued from S0 for T (usually 1) tokens, returning (o, S_T).
# S0 is required: a layer decodes after its prompt's prefill.
def gated_step(q, k, v, g, scale, S0, impl: str | None = None):
    if use_fla("gated", q, impl):
        return fla.gated_step(q, k, v, g, scale, S0)
    return gated_recurrent(q, k, v, g, scale, S0)


def delta_rule_step(q, k, v, beta, scale, g=None, S0=None, impl: str | None = None):
    if use_fla("delta_rule", q, impl):
        return fla.delta_rule_step(q, k, v, beta, scale, g, S0)
    return delta_rule_recurrent(q, k, v, beta, scale, g, S0)


def oja_step(q, k, v, gv, beta, scale, S0, impl: str | None = None):
    if use_fla("oja", q, impl):
        return fla.oja_step(q, k, v, gv, beta, scale, S0)
    return oja_recurrent(q, k, v, gv, beta, scale, S0)
