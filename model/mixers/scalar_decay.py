"""Linear attention with a scalar decay per head: `retnet` (fixed) and `mamba2` (data dependent).

    S_t = a_t S_{t-1} + k_t v_t^T,   o_t = S_t^T q_t / sqrt(D),   y = W_o [RMSNorm(o_t) * silu(x W_g)]

    retnet:  a = gamma_h = 1 - 2^(-5-h), h = 0..H-1   (Sun et al. 2023; fixed per head)
    mamba2:  a_t = exp(-exp(A_log) softplus(x W_a + dt_bias))   (Dao & Gu 2024's scalar selective decay)

Seen from softmax attention, prod_s a_s = exp(c_t - c_j): RetNet is ALiBi with slope -log gamma_h, Mamba2 is FoX
(seed 000, sections 2-3). Both run on the gated recurrence with the gate broadcast over channels.
"""

from __future__ import annotations

import torch
from torch import nn

from duality.kernels.recurrences import gated, gated_step

from ..core.context import TRAINING
from ..core.layers import GatedOutput, ScalarDecay, split_linear
from .base import Mixer, register


def retnet_gammas(n_heads: int) -> torch.Tensor:
    return 1 - 2.0 ** (-5 - torch.arange(n_heads, dtype=torch.float64))


class _ScalarDecay(Mixer):
    pe_kinds = ("none", "absolute", "rotary")
    packable = True

    def __init__(self, d_model, n_heads, pe=None, *, output_gate: bool = True):
        super().__init__(d_model, n_heads, pe)
        H = n_heads
        # every projection of x in one Linear, [q | k | v | a (Mamba2) | output gate], one matmul for each of q, k
        # and v (contiguous, so FLA's kernels copy none; measured on GLA, docs/throughput) and one for the gates
        # (kept for backward; split_linear says why)
        self.output_gate = output_gate
        self.sizes = [3 * d_model, H if self.selective else 0, d_model if output_gate else 0]
        self.in_proj = nn.Linear(d_model, sum(self.sizes), bias=False)
        self.out = GatedOutput(d_model, H, self.head_dim)

    context_parallel = True  # the state handed over between ranks (kernels/recurrences/cp.py), convolutions too

    def forward(self, x, ctx=TRAINING):
        B, T, _ = x.shape
        d = self.d_model
        *qkv, gates = split_linear(x, self.in_proj, [d, d, d, sum(self.sizes[1:])])
        a, gate = gates.split(self.sizes[1:], -1)
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim) for t in qkv)
        g = self._log_gate(a, T)[..., None].expand(B, T, -1, -1)  # [B, T, H, 1]: one gate per head
        q, k = self.rotate_qk(q, k, x, ctx)
        o = self.recurrence(gated, gated_step, (q, k, v, g, self.head_dim ** -0.5), ctx)
        return self.out(o, gate if self.output_gate else None)

    def log_gate(self, x):
        return self._log_gate(self.in_proj(x).split(self.sizes, -1)[1], x.shape[1])

    def flops_per_token(self, seq_len):
        return 6.0 * self.n_heads * self.head_dim ** 2


@register("retnet")
class RetNet(_ScalarDecay):
    selective = False

    def __init__(self, d_model, n_heads, pe=None, *, output_gate: bool = True):
        super().__init__(d_model, n_heads, pe, output_gate=output_gate)
        self.register_buffer("log_gamma", torch.log(retnet_gammas(n_heads)).float(), persistent=False)

    def _log_gate(self, a, T):
        return self.log_gamma.to(a.device).expand(1, T, -1)


@register("mamba2")
class Mamba2Decay(_ScalarDecay):
    selective = True

    def __init__(self, d_model, n_heads, pe=None, *, output_gate: bool = True):
        super().__init__(d_model, n_heads, pe, output_gate=output_gate)
        self.decay = ScalarDecay(n_heads)

    def _log_gate(self, a, T):
        return self.decay(a)
