"""Symmetric power transformers (Buckman et al. 2024), the `sympow` backbone, gated and conformal (seed 003).

    q, k, v = x W_q, x W_k, x W_v                          H heads of size d
    q, k    = rotary scheme (rope, learned_rotation, selective_rope) at absolute positions, if any
    B_ij    = b_ij s_ij^p,   s_ij = q_i.k_j / sqrt(d),   p even (`power`)       pre-attention scores, all >= 0
    b_ij    = prod_{s=j+1..i} gamma_s,  gamma_t = sigmoid(x_t W_gamma + b)     (`gating`; else b_ij = 1)
    y_i     = sum_{j<=i} B_ij v_j / sum_{j<=i} B_ij,   out = y W_o

The attention form is decayed attention with power scores (kernels/attention/, fused on CUDA); the scale cancels
in the ratio and only keeps s^p in range. conformal-sympow (seed 003 section 3.3) is gating + pe=learned_rotation:
`backbone=conformal_sympow`.

Recurrent form (Propositions 1-2). The symmetric power feature map of p = 2, phi(x) = (x_a x_b for a <= b, times
sqrt 2 when a < b) of size d(d+1)/2, has phi(x).phi(y) = (x.y)^2, so with gamma_t (1 without gating)

    S_i = gamma_i S_{i-1} + v_i phi(k_i)^T,   Z_i = gamma_i Z_{i-1} + phi(k_i),   y_i = S_i phi(q_i) / Z_i.phi(q_i)

(q and k scaled by d^(-1/4), so phi(q).phi(k) = s^2): a (d + 1) x d(d+1)/2 state per head whatever the length.
`recurrent: true` decodes with it instead of a KV cache; a prompt of T tokens is one chunk, its terms summed
explicitly. p = 4's state (d^4/24 per head, 14 GB for the paper's model) does not fit: it decodes with the KV cache.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from duality.common.errors import ConfigError
from duality.kernels.attention import cumulative_log_decay

from ..core.context import TRAINING
from ..core.layers import residual_linear, up
from .base import Mixer, gated_attention, register


def sympow_features(x: torch.Tensor) -> torch.Tensor:
    """phi [..., d(d+1)/2] of x [..., d] for p = 2: phi(x) . phi(y) = (x . y)^2."""
    d = x.shape[-1]
    a, b = torch.triu_indices(d, d, device=x.device)
    w = torch.full(a.shape, math.sqrt(2.0), dtype=x.dtype, device=x.device).masked_fill(a == b, 1.0)
    return x[..., a] * x[..., b] * w


def sympow_recurrent(q, k, v, log_gate=None, state=None):
    """The recurrent form of p = 2 over one chunk of T tokens continuing from state (S [B, H, d, D], Z [B, H, D]) or
    from zero: y [B, T, H, d] and the state after the chunk. T = 1 is one step of the recurrence; a longer chunk
    sums its own terms exp(c_i - c_j) phi(q_i).phi(k_j) explicitly and adds the decayed state."""
    B, T, H, d = q.shape
    dt = torch.promote_types(q.dtype, torch.float32)
    fq, fk = (sympow_features(t.to(dt) * d ** -0.25) for t in (q, k))  # [B, T, H, D]
    c = torch.zeros(B, T, H, dtype=dt, device=q.device) if log_gate is None else cumulative_log_decay(log_gate.to(dt))
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    ch = c.transpose(1, 2)  # [B, H, T]
    decay = torch.exp((ch[..., :, None] - ch[..., None, :]).masked_fill(~causal, -math.inf))  # b_ij
    w = torch.einsum("bihD,bjhD->bhij", fq, fk) * decay  # [B, H, T, T]
    num = torch.einsum("bhij,bjhd->bihd", w, v.to(dt))
    den = w.sum(-1).transpose(1, 2)  # [B, T, H]
    to_end = torch.exp(c[:, -1:] - c)  # b_Tj, [B, T, H]
    S = torch.einsum("bjh,bjhd,bjhD->bhdD", to_end, v.to(dt), fk)
    Z = torch.einsum("bjh,bjhD->bhD", to_end, fk)
    if state is not None:
        S0, Z0 = state
        g = torch.exp(c)  # b_{i,0}: the gates of the chunk up to i
        num = num + g[..., None] * torch.einsum("bhdD,bihD->bihd", S0, fq)
        den = den + g * torch.einsum("bhD,bihD->bih", Z0, fq)
        S = S + torch.exp(c[:, -1])[..., None, None] * S0
        Z = Z + torch.exp(c[:, -1])[..., None] * Z0
    return (num / den[..., None]).to(q.dtype), (S, Z)


@register("sympow")
class SymPow(Mixer):
    pe_kinds = ("none", "absolute", "rotary")
    context_parallel = True  # trained in its attention form (kernels/attention/cp.py)

    def __init__(self, d_model, n_heads, pe=None, *, power: int = 2, gating: bool = False, recurrent: bool = False):
        super().__init__(d_model, n_heads, pe)
        if not (isinstance(power, int) and power >= 2 and power % 2 == 0):
            raise ConfigError(f"backbone=sympow: power must be an even integer (2 or 4 in seed 003), got {power!r}")
        if recurrent and power != 2:
            raise ConfigError(f"backbone=sympow: recurrent=true needs power=2 (the state of power={power} has "
                              f"C(d+{power - 1}, {power}) features per head); use recurrent=false (a KV cache)")
        self.power, self.recurrent = power, recurrent
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.gate = nn.Linear(d_model, n_heads, bias=True) if gating else None
        self.o_proj = residual_linear(d_model, d_model)

    def init_extra(self):
        if self.gate is not None:  # FoX's init (gamma = sigmoid(b) in [0.73, 0.99] over heads): long memory first
            with torch.no_grad():
                self.gate.bias.copy_(torch.linspace(1.0, 5.0, self.n_heads))

    def log_gate(self, x):
        return None if self.gate is None else F.logsigmoid(up(self.gate(x)))  # log gamma [B, T, H]

    def forward(self, x, ctx=TRAINING):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).unbind(2)
        q, k = self.rotate_qk(q, k, x, ctx)
        f = self.log_gate(x)
        if ctx.state is not None and self.recurrent:
            o, ctx.state.S = sympow_recurrent(q, k, v, f, ctx.state.S)
        else:
            o = gated_attention(q, k, v, f, ctx, power=self.power)
        return self.o_proj(o.reshape(B, T, self.d_model))

    def flops_per_token(self, seq_len):
        return 2.0 * self.d_model * (seq_len + 1)
