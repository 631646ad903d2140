"""Gated Linear Attention (Yang et al. 2024), the `gla` backbone: a data-dependent diagonal forget gate.

    q, k = x W_q, x W_k                  (key dim per head D_k = expand_k * d_model / H)
    v    = x W_v                         (value dim per head D_v = expand_v * d_model / H)
    q, k, v = silu(conv(q)), ...         optional (short_conv): causal depthwise convolutions, kernel 4, as FLA's
                                         GLA layer with use_short_conv (seed 004's state-tracking model)
    g_t  = logsigmoid(x W_1 W_2 + b) / tau     low rank r, normaliser tau = 16: log alpha_t, in (-inf, 0)^{D_k}
    S_t  = diag(alpha_t) S_{t-1} + k_t v_t^T,  o_t = S_t^T q_t / sqrt(D_k)          (kernels/recurrences/)
    y    = W_o [RMSNorm(o_t) * silu(x W_r)]          (W_q, W_k, W_v, W_1, W_r: one Linear)

Seen from softmax attention, prod_s diag(alpha_s) is FoX's forget gate made per channel (seed 000, section 3).
A rotary scheme rotates q and k (GLA + RoPE / Selective RoPE). The incremental form keeps S (D_k x D_v per head).
"""

from __future__ import annotations

from torch import nn

from duality.kernels.recurrences import gated, gated_step

from ..core.context import TRAINING
from ..core.layers import GatedOutput, LowRankGate, ShortConv, split_linear
from .base import Mixer, register


@register("gla")
class GLA(Mixer):
    pe_kinds = ("none", "absolute", "rotary")
    packable = True

    @classmethod
    def qk_dim(cls, d_model, n_heads, *, expand_k: float = 0.5, **_):
        return int(d_model * expand_k) // n_heads

    def __init__(self, d_model, n_heads, pe=None, *, expand_k: float = 0.5, expand_v: float = 1.0,
                 gate_low_rank: int = 16, gate_normalizer: float = 16.0, output_gate: bool = True,
                 short_conv: bool = False, conv_size: int = 4):
        super().__init__(d_model, n_heads, pe)
        self.dk, self.dv = self.qk_dim(d_model, n_heads, expand_k=expand_k), int(d_model * expand_v) // n_heads
        if self.dk < 1 or self.dv < 1:
            raise ValueError(f"gla: expand_k={expand_k}, expand_v={expand_v} leave no channels per head")
        H = n_heads
        # every projection of x in one Linear, [q | k | v | W_1 (gate, low rank) | output gate], one matmul for each
        # of q, k and v (contiguous, so FLA's kernels copy none; 1.5% of a 370m step, docs/throughput) and one for
        # the gates (kept for backward; split_linear says why)
        self.output_gate = output_gate
        self.sizes = [H * self.dk, H * self.dk, H * self.dv, gate_low_rank, H * self.dv if output_gate else 0]
        self.in_proj = nn.Linear(d_model, sum(self.sizes), bias=False)
        self.g_up = LowRankGate(gate_low_rank, H, self.dk, gate_normalizer)  # W_2, b
        self.out = GatedOutput(d_model, H, self.dv)
        # depthwise, so one convolution over [q | k | v] is the three of FLA's layer
        self.conv = ShortConv(H * (2 * self.dk + self.dv), conv_size) if short_conv else None

    context_parallel = True  # the state handed over between ranks (kernels/recurrences/cp.py), convolutions too

    def forward(self, x, ctx=TRAINING):
        B, T, _ = x.shape
        H = self.n_heads
        if self.conv is None:
            q, k, v, gates = split_linear(x, self.in_proj, [*self.sizes[:3], sum(self.sizes[3:])])
        else:  # one depthwise convolution over [q | k | v]
            qkv, gates = split_linear(x, self.in_proj, [sum(self.sizes[:3]), sum(self.sizes[3:])])
            q, k, v = self.conv(qkv, ctx).split(self.sizes[:3], -1)
        g_low, gate = gates.split(self.sizes[3:], -1)
        q, k, v = q.view(B, T, H, self.dk), k.view(B, T, H, self.dk), v.view(B, T, H, self.dv)
        g = self.g_up(g_low)
        q, k = self.rotate_qk(q, k, x, ctx)
        o = self.recurrence(gated, gated_step, (q, k, v, g, self.dk ** -0.5), ctx)
        return self.out(o, gate if self.output_gate else None)

    def log_gate(self, x):
        return self.g_up(self.in_proj(x).split(self.sizes, -1)[3]).mean(-1)

    def flops_per_token(self, seq_len):
        # state update k v^T, decay, readout S^T q: ~ 3 x 2 H D_k D_v (chunked kernels add intra-chunk work)
        return 6.0 * self.n_heads * self.dk * self.dv
