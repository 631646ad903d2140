"""Softmax attention (the `transformer` backbone).

    q, k, v = x W_q, x W_k, x W_v                    (H heads of size D = d_model / H)
    q, k    = rotary scheme (if any) applied at absolute positions
    o_i     = sum_{j<=i} softmax_j(q_i.k_j / sqrt(D) + (c_i - c_j) + b_ij) v_j      (kernels/attention/)
              (ALiBi: c_i - c_j = -m_h (i - j), the fused kernel on CUDA; no score scheme: SDPA)
    y       = o W_o

A score scheme supplies the log-decay c (ALiBi) and/or the bias b (T5, Transformer-XL); VO-RoPE rotates v_j by R_j
and the output by R_t^T. Every hook is called whatever the scheme (identity where it does not act). The incremental
form keeps a KV cache: keys (and values) are cached after rotation, so each token is rotated once, at its own
position.
"""

from __future__ import annotations

from torch import nn

from ..core.context import TRAINING
from ..core.layers import residual_linear
from .base import Mixer, attention, extend_cache, register


@register("transformer")
class SoftmaxAttention(Mixer):
    softmax = True
    pe_kinds = ("none", "absolute", "rotary", "score", "vo_rotary")
    packable = True
    context_parallel = True  # each rank's queries against the keys up to them (kernels/attention/cp.py)

    def __init__(self, d_model, n_heads, pe=None, *, qk_norm: bool = False):
        super().__init__(d_model, n_heads, pe)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.o_proj = residual_linear(d_model, d_model)
        self.q_norm = nn.RMSNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(self.head_dim) if qk_norm else nn.Identity()

    def forward(self, x, ctx=TRAINING):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).unbind(2)
        q, k = self.rotate_qk(self.q_norm(q), self.k_norm(k), x, ctx)
        v = self.rotate_values(v, ctx)
        if ctx.state is not None:
            k, v = extend_cache(ctx, k=k, v=v)
        if ctx.cp_group is not None and self.pe is not None and self.pe.score_bias:
            # T5's and Transformer-XL's bias spans every key up to this slice: asked for once they are gathered
            scores = {"bias_for": lambda keys: self.scores(q, keys, ctx)["bias"]}
        else:
            scores = self.scores(q, k, ctx)
        o = attention(q, k, v, ctx, **scores)
        return self.o_proj(self.rotate_output(o, ctx).reshape(B, T, self.d_model))

    def flops_per_token(self, seq_len):
        # q.k and p.v: 2 matmuls x 2 FLOPs x d_model x mean causal context (seq_len + 1) / 2
        return 2.0 * self.d_model * (seq_len + 1)
