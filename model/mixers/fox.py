"""Forgetting Transformer (Lin et al. 2025), the `fox` backbone: softmax attention with a data-dependent forget gate.

    f_t  = logsigmoid(x_t w_f + b_f)          one log gate per head and token
    c_t  = sum_{s<=t} f_s,  score_ij = q_i.k_j / sqrt(D) + c_i - c_j        (kernels/attention/, fused on CUDA)
    "pro" options (each a flag): q/k RMSNorm (qk_norm), output gate y = W_o [o * sigmoid(x W_g)] (output_gate),
    short causal convolutions on q, k, v (short_conv).

The gate is Mamba2's scalar decay moved into the softmax scores (seed 000, section 3); with a constant gate it is
ALiBi (tests/test_duality.py). The incremental form keeps the KV cache and the running c.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.context import TRAINING
from ..core.layers import ShortConv, residual_linear, up
from .base import Mixer, gated_attention, register


@register("fox")
class FoX(Mixer):
    softmax = True
    pe_kinds = ("none", "absolute", "rotary")
    packable = True

    def __init__(self, d_model, n_heads, pe=None, *, qk_norm: bool = False, output_gate: bool = False,
                 short_conv: bool = False, conv_size: int = 4):
        super().__init__(d_model, n_heads, pe)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.f_proj = nn.Linear(d_model, n_heads, bias=True)
        self.q_norm = nn.RMSNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(self.head_dim) if qk_norm else nn.Identity()
        self.conv = ShortConv(3 * d_model, conv_size) if short_conv else None
        self.g_proj = nn.Linear(d_model, d_model, bias=False) if output_gate else None
        self.o_proj = residual_linear(d_model, d_model)

    def init_extra(self):
        # FoX's init: forget-gate bias so that sigmoid starts near 1 (long memory), range [1, 5] over heads
        with torch.no_grad():
            self.f_proj.bias.copy_(torch.linspace(1.0, 5.0, self.n_heads))

    context_parallel = True  # the keys and the gate's sums from the slices before (kernels/attention/cp.py)

    @property
    def packed(self):  # the short convolution would reach across documents: run per document then
        return self.conv is None and super().packed

    def forward(self, x, ctx=TRAINING):
        B, T, _ = x.shape
        qkv = self.qkv(x)
        if self.conv is not None:
            qkv = self.conv(qkv, ctx)
        q, k, v = qkv.view(B, T, 3, self.n_heads, self.head_dim).unbind(2)
        q, k = self.q_norm(q), self.k_norm(k)
        f = self.log_gate(x)
        q, k = self.rotate_qk(q, k, x, ctx)
        o = gated_attention(q, k, v, f, ctx).reshape(B, T, self.d_model)
        if self.g_proj is not None:
            o = o * torch.sigmoid(self.g_proj(x))
        return self.o_proj(o)

    def log_gate(self, x):
        return F.logsigmoid(up(self.f_proj(x)))  # [B, T, H]

    def flops_per_token(self, seq_len):
        return 2.0 * self.d_model * (seq_len + 1)
