"""Linear attention (Katharopoulos et al.), the `linear_attn` backbone: softmax removed, no forget gate.

    S_t = S_{t-1} + v_t k_t^T,      o_t = S_t q_t            (per head; q scaled by 1/sqrt(D))
        = sum_{j<=t} (q_t.k_j) v_j  = ((Q K^T) * M) V        (parallel form, M the causal 0/1 mask)
    y_t = RMSNorm(o_t) W_o                                   (per-head output norm keeps the scale in check)

A_t = 1 means no decay: its dual is NoPE (seed 000, section 1). A rotary scheme on q and k turns it into the
complex-gated recurrence S_t = S_{t-1} e^{i Omega} + v_t k_t^H (section 4). Score schemes do not apply: there are no
softmax scores to bias. The incremental form keeps only S (constant memory per token).
"""

from __future__ import annotations

import torch
from torch import nn

from .base import Mixer, register, residual_linear


def linear_attention_parallel(q, k, v, S0=None):
    """q, k, v [B, T, H, D]; S0 [B, H, D_v, D_k] or None. Returns o [B, T, H, D] and the final state."""
    T = q.shape[1]
    scores = torch.einsum("bihd,bjhd->bhij", q, k)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), 0.0)
    o = torch.einsum("bhij,bjhd->bihd", scores, v)
    S = torch.einsum("bjhe,bjhd->bhed", v, k)
    if S0 is not None:
        o = o + torch.einsum("bhed,bthd->bthe", S0, q)
        S = S + S0
    return o, S


def linear_attention_recurrent(q, k, v, S0=None):
    """The same function token by token: S_t = S_{t-1} + v_t k_t^T, o_t = S_t q_t."""
    B, T, H, D = q.shape
    S = q.new_zeros(B, H, v.shape[-1], D) if S0 is None else S0
    outs = []
    for t in range(T):
        S = S + torch.einsum("bhe,bhd->bhed", v[:, t], k[:, t])
        outs.append(torch.einsum("bhed,bhd->bhe", S, q[:, t]))
    return torch.stack(outs, 1), S


@register("linear_attn")
class LinearAttention(Mixer):
    pe_kinds = ("none", "absolute", "rotary")

    def __init__(self, d_model, n_heads, pe=None):
        super().__init__(d_model, n_heads, pe)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.o_norm = nn.RMSNorm(self.head_dim)
        self.o_proj = residual_linear(d_model, d_model)

    def forward(self, x, cache=None):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).unbind(2)
        offset = 0 if cache is None else cache.get("offset", 0)
        q, k = self.rotate_qk(q * self.head_dim ** -0.5, k, x, cache, offset)
        S0 = None if cache is None else cache.get("S")
        step = linear_attention_recurrent if cache is not None and T == 1 else linear_attention_parallel
        o, S = step(q, k, v, S0)
        if cache is not None:
            cache.update(S=S, offset=offset + T)
        return self.o_proj(self.o_norm(o).reshape(B, T, self.d_model))

    def flops_per_token(self, seq_len):
        # chunked/recurrent cost: state update v k^T and readout S q, 2 FLOPs per MAC, H * D * D each
        return 4.0 * self.n_heads * self.head_dim ** 2
