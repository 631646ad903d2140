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
`gated`, `delta_rule` and `oja` dispatch: FLA's Triton kernels on CUDA, the references elsewhere. `gated`,
`delta_rule` and `oja` take packed documents (B = 1, boundaries cu_seqlens [N + 1]): each document starts from S = 0; FLA's
varlen kernels on CUDA, the reference per document elsewhere.
"""

from __future__ import annotations

import torch

from .documents import per_document


def _fla_ok(x: torch.Tensor) -> bool:
    return x.is_cuda


def _f32(*xs):
    """References accumulate in at least fp32 (the state sums over many tokens)."""
    dt = torch.promote_types(xs[0].dtype, torch.float32)
    return [None if x is None else x.to(dt) for x in xs]


def _state(q, v, S0):
    """The initial state [B, H, K, V]: S0, or zeros."""
    B, _, H, K = q.shape
    return q.new_zeros(B, H, K, v.shape[-1]) if S0 is None else S0.to(q.dtype)


# --------------------------------------------------------------------------------------------- gated (GLA family)
def gated_recurrent(q, k, v, g, scale, S0=None):
    q, k, v, g = _f32(q, k, v, g)
    B, T, H, K = q.shape
    S = _state(q, v, S0)
    g = g.expand(B, T, H, K)
    out = []
    for t in range(T):
        S = torch.exp(g[:, t])[..., None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]) * scale)
    return torch.stack(out, 1), S


def gated_chunked(q, k, v, g, scale, S0=None, chunk: int = 16):
    """Exact chunked form: inside a chunk, scores use exp(G_i - G_j) pairwise (<= 1); across chunks the state is
    carried as in the recurrence."""
    q, k, v, g = _f32(q, k, v, g)
    B, T, H, K = q.shape
    g = g.expand(B, T, H, K)
    S = _state(q, v, S0)
    out = []
    for s in range(0, T, chunk):
        qc, kc, vc, G = q[:, s:s + chunk], k[:, s:s + chunk], v[:, s:s + chunk], torch.cumsum(g[:, s:s + chunk], 1)
        C = qc.shape[1]
        causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
        diff = (G[:, :, None] - G[:, None, :]).masked_fill(~causal[None, :, :, None, None], float("-inf"))
        A = torch.einsum("bihk,bjhk,bijhk->bhij", qc, kc, torch.exp(diff))
        o = torch.einsum("bhij,bjhv->bihv", A, vc) + torch.einsum("bihk,bhkv->bihv", qc * torch.exp(G), S)
        out.append(o * scale)
        last = G[:, -1:]
        S = torch.exp(last[:, 0])[..., None] * S + torch.einsum("bjhk,bjhv->bhkv", kc * torch.exp(last - G), vc)
    return torch.cat(out, 1), S


def gated(q, k, v, g, scale, S0=None, output_state=False, cu_seqlens=None):
    """g: [B, T, H, K] (diagonal gate) or [B, T, H, 1] (scalar gate per head), log space."""
    if _fla_ok(q):
        if g.shape[-1] == 1:
            from fla.ops.simple_gla import chunk_simple_gla
            return chunk_simple_gla(q, k, v, g=g[..., 0].float(), scale=scale, initial_state=S0,
                                    output_final_state=output_state, cu_seqlens=cu_seqlens)
        from fla.ops.gla import chunk_gla
        return chunk_gla(q, k, v, g=g.float(), scale=scale, initial_state=S0, output_final_state=output_state,
                         cu_seqlens=cu_seqlens)
    if cu_seqlens is not None:
        o = per_document(lambda *a: gated_chunked(*a)[0], cu_seqlens, q, k, v, g.expand(*q.shape[:3], g.shape[-1]),
                         scale)
        return o, None
    return gated_chunked(q, k, v, g, scale, S0)


# --------------------------------------------------------------------------------------------------- delta rule
def delta_rule_recurrent(q, k, v, beta, scale, g=None, S0=None):
    """g: [B, T, H] log decay (None for DeltaNet); beta: [B, T, H]."""
    q, k, v, beta, g = _f32(q, k, v, beta, g)
    B, T, H, K = q.shape
    S = _state(q, v, S0)
    out = []
    for t in range(T):
        if g is not None:
            S = torch.exp(g[:, t])[..., None, None] * S
        kt = k[:, t]
        v_new = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, kt))
        S = S + kt[..., None] * v_new[:, :, None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]) * scale)
    return torch.stack(out, 1), S


def delta_rule_chunked(q, k, v, beta, scale, g=None, S0=None, chunk: int = 16):
    """Exact chunked form (the WY / UT-transform algorithm of DeltaNet, with Gated DeltaNet's decay). Per chunk, with
    G the within-chunk cumulative log decay and Gam_ij = exp(G_i - G_j):
        Tm = (I + strict_tril(diag(beta) (K K^T * Gam)))^{-1}
        W = Tm diag(beta) (K * e^G),   U = Tm diag(beta) V,   U' = U - W S      (the "pseudo values")
        O = (Q * e^G) S + tril(Q K^T * Gam) U',   S <- e^{G_C} S + (K * e^{G_C - G})^T U'"""
    q, k, v, beta, g = _f32(q, k, v, beta, g)
    B, T, H, K = q.shape
    S = _state(q, v, S0)
    out = []
    for s in range(0, T, chunk):
        qc, kc, vc = (t[:, s:s + chunk].transpose(1, 2) for t in (q, k, v))  # [B, H, C, .]
        bc = beta[:, s:s + chunk].transpose(1, 2)[..., None]
        C = qc.shape[2]
        G = torch.zeros(B, H, C, 1, dtype=q.dtype, device=q.device) if g is None else \
            torch.cumsum(g[:, s:s + chunk].transpose(1, 2), -1)[..., None]
        gam = torch.exp((G - G.transpose(-1, -2)).masked_fill(~torch.ones(C, C, dtype=torch.bool, device=q.device).tril(), -float("inf")))
        eye = torch.eye(C, dtype=q.dtype, device=q.device)
        A = (bc * (kc @ kc.transpose(-1, -2)) * gam).tril(-1)
        Tm = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
        W, U = Tm @ (bc * kc * torch.exp(G)), Tm @ (bc * vc)
        Up = U - W @ S
        out.append(((qc * torch.exp(G)) @ S + ((qc @ kc.transpose(-1, -2)) * gam) @ Up).transpose(1, 2) * scale)
        GC = G[:, :, -1:]
        S = torch.exp(GC) * S + (kc * torch.exp(GC - G)).transpose(-1, -2) @ Up
    return torch.cat(out, 1), S


def delta_rule(q, k, v, beta, scale, g=None, S0=None, output_state=False, cu_seqlens=None):
    if _fla_ok(q):
        if g is None and q.dtype != torch.float32:
            from fla.ops.delta_rule import chunk_delta_rule
            return chunk_delta_rule(q, k, v, beta=beta, scale=scale, initial_state=S0, output_final_state=output_state,
                                    cu_seqlens=cu_seqlens)
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        if g is None:  # FLA 0.6's chunk_delta_rule refuses float32 (an fp32 run of DeltaNet): the gated one, g = 0
            g = q.new_zeros(q.shape[:3])
        return chunk_gated_delta_rule(q, k, v, g=g.float(), beta=beta, scale=scale, initial_state=S0,
                                      output_final_state=output_state, cu_seqlens=cu_seqlens)
    if cu_seqlens is not None:
        return per_document(lambda *a: delta_rule_chunked(*a)[0], cu_seqlens, q, k, v, beta, scale, g), None
    return delta_rule_chunked(q, k, v, beta, scale, g, S0)


# ------------------------------------------------------------------------------------------------ gated Oja rule
def oja_recurrent(q, k, v, gv, beta, scale, S0=None):
    """gv: [B, T, H, V] log gate on the value side; beta: [B, T, H]. FLA's state S [K, V]:
    S <- S diag(exp(gv_t));  S <- S + (beta_t (k_t - S v_t)) v_t^T;  o_t = scale S^T q_t."""
    q, k, v, gv, beta = _f32(q, k, v, gv, beta)
    B, T, H, K = q.shape
    S = _state(q, v, S0)
    out = []
    for t in range(T):
        S = S * torch.exp(gv[:, t])[:, :, None, :]
        vt = v[:, t]
        k_new = beta[:, t, :, None] * (k[:, t] - torch.einsum("bhkv,bhv->bhk", S, vt))
        S = S + k_new[..., None] * vt[:, :, None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]) * scale)
    return torch.stack(out, 1), S


def oja(q, k, v, gv, beta, scale, S0=None, output_state=False, cu_seqlens=None):
    if _fla_ok(q):
        from fla.ops.gated_oja_rule import chunk_gated_oja_rule
        return chunk_gated_oja_rule(q, k, v, gv=gv.float(), beta=beta, scale=scale, initial_state=S0,
                                    output_final_state=output_state, cu_seqlens=cu_seqlens)
    if cu_seqlens is not None:
        return per_document(lambda *a: oja_recurrent(*a)[0], cu_seqlens, q, k, v, gv, beta, scale), None
    return oja_recurrent(q, k, v, gv, beta, scale, S0)
