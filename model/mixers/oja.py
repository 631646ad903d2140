"""Gated Oja rule (seed 001), the `gated_oja` backbone: a value-side ("VO") position encoding.

    q, k = x W_q, x W_k;  v = L2norm(x W_v)
    alpha_t = exp(logsigmoid(x W_1 W_2 + b) / tau)       per value channel (low rank, as GLA's key gate)
    beta_t  = sigmoid(x_t w_beta)
    S_t = (I - beta_t v_t v_t^T) diag(alpha_t) S_{t-1} + beta_t v_t k_t^T          (S: D_v x D_k)
    o_t = S_t q_t / sqrt(D_k),   y = W_o [RMSNorm(o_t) * silu(x W_g)]     (W_q, W_k, W_v, W_1, w_beta, W_g: one Linear)

Unrolled, o_t = sum_j [prod_{s=j+1..t} (I - beta_s v_s v_s^T) diag(alpha_s)] v_j (k_j^T q_t): the transition acts on
the values, where gated DeltaNet's acts between q and k (seed 001 eqs. 3-4). Kernel: FLA's chunk_gated_oja_rule.
"""

from __future__ import annotations

import torch
from torch import nn

from duality.kernels.recurrences import oja, oja_step

from ..core.context import TRAINING
from ..core.layers import GatedOutput, LowRankGate, l2norm, split_linear, up
from .base import Mixer, register


@register("gated_oja")
class GatedOja(Mixer):
    pe_kinds = ("none", "absolute", "rotary")
    packable = True
    context_parallel = True  # the value-side transition and state handed over (kernels/recurrences/cp.py)

    def __init__(self, d_model, n_heads, pe=None, *, gate_low_rank: int = 16, gate_normalizer: float = 16.0,
                 output_gate: bool = True):
        super().__init__(d_model, n_heads, pe)
        D, H = self.head_dim, n_heads
        # every projection of x in one Linear, [q | k | v | W_1 (gate, low rank) | w_beta | output gate], one matmul
        # for each of q, k and v (contiguous, so FLA's kernels copy none) and one for the rest (kept for backward;
        # split_linear says why)
        self.output_gate = output_gate
        self.sizes = [3 * d_model, gate_low_rank, H, d_model if output_gate else 0]
        self.in_proj = nn.Linear(d_model, sum(self.sizes), bias=False)
        self.g_up = LowRankGate(gate_low_rank, H, D, gate_normalizer)  # W_2, b
        self.out = GatedOutput(d_model, H, D)

    def forward(self, x, ctx=TRAINING):
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        d = self.d_model
        *qkv, rest = split_linear(x, self.in_proj, [d, d, d, sum(self.sizes[1:])])
        g_low, b, gate = rest.split(self.sizes[1:], -1)
        q, k, v = (t.view(B, T, H, D) for t in qkv)
        v = l2norm(v)
        gv = self.g_up(g_low)
        beta = torch.sigmoid(up(b))
        q, k = self.rotate_qk(q, k, x, ctx)
        o = self.recurrence(oja, oja_step, (q, k, v, gv, beta, D ** -0.5), ctx)
        return self.out(o, gate if self.output_gate else None)

    def log_gate(self, x):
        return self.g_up(self.in_proj(x).split(self.sizes, -1)[1]).mean(-1)

    def flops_per_token(self, seq_len):
        return 6.0 * self.n_heads * self.head_dim ** 2
