"""The recurrences from their definitions (kernels/recurrences/__init__.py): `*_recurrent` token by token (the
oracles and the decoding step), `*_chunked` exact chunked parallel forms (the CPU training path)."""

from __future__ import annotations

import torch


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


def gla_bwd_dv_reference(k, g, A, do, dh, chunk_size: int):
    """The value gradient of FLA's chunked GLA backward (gla_dv.py), per chunk c of C rows: tril(A_c)^T do_c +
    (k_c * 2^(G_last - G_c)) dh_c, with g the chunk-local cumulative log2 gate, A [B, T, H, C] the forward's
    intra-chunk scores and dh [B, NT, H, K, V] the gradients of the states at the chunks' ends; float64."""
    k, g, A, do, dh = (x.double() for x in (k, g, A, do, dh))
    T, C = k.shape[1], chunk_size
    out = []
    for c, s in enumerate(range(0, T, C)):
        n = min(C, T - s)
        a = A[:, s:s + n, :, :n] * torch.ones(n, n, dtype=torch.bool, device=A.device).tril()[None, :, None]
        decay = torch.exp2(g[:, s + n - 1:s + n] - g[:, s:s + n])
        out.append(torch.einsum("bthi,bthv->bihv", a, do[:, s:s + n])
                   + torch.einsum("bihk,bhkv->bihv", k[:, s:s + n] * decay, dh[:, c]))
    return torch.cat(out, 1)


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
        causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
        gam = torch.exp((G - G.transpose(-1, -2)).masked_fill(~causal, -float("inf")))
        eye = torch.eye(C, dtype=q.dtype, device=q.device)
        A = (bc * (kc @ kc.transpose(-1, -2)) * gam).tril(-1)
        Tm = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
        W, U = Tm @ (bc * kc * torch.exp(G)), Tm @ (bc * vc)
        Up = U - W @ S
        out.append(((qc * torch.exp(G)) @ S + ((qc @ kc.transpose(-1, -2)) * gam) @ Up).transpose(1, 2) * scale)
        GC = G[:, :, -1:]
        S = torch.exp(GC) * S + (kc * torch.exp(GC - G)).transpose(-1, -2) @ Up
    return torch.cat(out, 1), S


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
