"""Linear attention (Katharopoulos et al.), the `linear_attn` backbone: softmax removed, no forget gate.

    S_t = S_{t-1} + k_t v_t^T,      o_t = S_t^T q_t          (per head; q scaled by 1/sqrt(D))
        = sum_{j<=t} (q_t.k_j) v_j  = ((Q K^T) * M) V        (M the causal 0/1 mask)
    y_t = RMSNorm(o_t) W_o                                   (per-head output norm keeps the scale in check)

It is the gated recurrence of kernels/recurrences/ with log gate g = 0, and runs on it: chunked (FLA's kernel on
CUDA), never the T x T matrix of the second line (4 GiB per layer at 370m, context 4,096).

A_t = 1 means no decay: its dual is NoPE (seed 000, section 1). A rotary scheme on q and k turns it into the
complex-gated recurrence S_t = S_{t-1} e^{i Omega} + v_t k_t^H (section 4). Score schemes do not apply: there are no
softmax scores to bias. The incremental form keeps only S (constant memory per token).
"""

from __future__ import annotations

import torch
from torch import nn

from duality.kernels.recurrences import gated, gated_step

from ..core.context import TRAINING
from ..core.layers import OUTPUT_NORM_EPS, residual_linear, split_linear
from .base import Mixer, register


@register("linear_attn")
class LinearAttention(Mixer):
    pe_kinds = ("none", "absolute", "rotary")
    packable = True

    def __init__(self, d_model, n_heads, pe=None):
        super().__init__(d_model, n_heads, pe)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.o_norm = nn.RMSNorm(self.head_dim, eps=OUTPUT_NORM_EPS)
        self.o_proj = residual_linear(d_model, d_model)

    context_parallel = True  # the state handed over between ranks (kernels/recurrences/cp.py), convolutions too

    def forward(self, x, ctx=TRAINING):
        B, T, _ = x.shape
        # q, k and v each its own matmul of the one Linear: contiguous, so FLA's kernel copies none
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim) for t in split_linear(x, self.qkv, [self.d_model] * 3))
        q, k = self.rotate_qk(q, k, x, ctx)
        g = q.new_zeros(B, T, self.n_heads, 1, dtype=torch.float32)  # no forget gate: log a_t = 0
        o = self.recurrence(gated, gated_step, (q, k, v, g, self.head_dim ** -0.5), ctx)
        return self.o_proj(self.o_norm(o.to(x.dtype)).reshape(B, T, self.d_model))

    def flops_per_token(self, seq_len):
        # chunked/recurrent cost: state update v k^T and readout S q, 2 FLOPs per MAC, H * D * D each
        return 4.0 * self.n_heads * self.head_dim ** 2
