"""PaTH attention (Yang et al. 2025) and PaTH-FoX: `path`, `path_fox`.

    q, k, v = x W_q, x W_k, x W_v
    w_t     = L2norm(ShortConv(x W_w))_t,   beta_t = 2 sigmoid(x_t w_beta)  in (0, 2)
    W_w     = W_down W_up  of rank w_rank (32, as FLA's PaTHAttention, the paper authors' code; null: full)
    score_ij = q_i^T (H_i ... H_{j+1})^T k_j / sqrt(D) (+ c_i - c_j),   H_s = I - beta_s w_s w_s^T
    f_t = logsigmoid(x_t w_f + b_f), c = cumsum(f)                          (path_fox only: FoX's forget gate)

The accumulated Householder product is DeltaNet's state transition used as a position encoding (seed 000,
section 5); adding the forget gate gives the dual of Gated DeltaNet (section 6). PaTH is itself the positional
scheme; a rotary scheme may still rotate q and k first (RoPE inside PaTH). Kernels: kernels/path_attention/ (FLA's
parallel_path_attn on CUDA).
The incremental form caches keys already moved through every later transform: k~_j <- H_t k~_j as token t arrives.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from duality.common.errors import ConfigError
from duality.kernels.attention import cached_attention
from duality.kernels.path_attention import householder, path_attention

from ..core.context import TRAINING
from ..core.layers import ShortConv, l2norm, residual_linear, up
from .base import Mixer, extend_cache, register


class _PaTH(Mixer):
    softmax = True
    pe_kinds = ("none", "rotary")
    forget_gate = False

    def __init__(self, d_model, n_heads, pe=None, *, conv_size: int = 3, qk_norm: bool = False,
                 w_rank: int | None = 32):
        super().__init__(d_model, n_heads, pe)
        H = n_heads
        if w_rank is not None and not 1 <= w_rank <= d_model:
            raise ConfigError(f"backbone={self.name}: w_rank={w_rank} must be in 1..d_model={d_model}, or null for "
                              "a full projection")
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        # w only sets the Householder directions (it is L2-normalised), so a low rank costs little and keeps the
        # parameter count of FLA's PaTH (24M fewer at 370m than a full d x d projection)
        self.w_proj = nn.Linear(d_model, d_model, bias=False) if w_rank is None else nn.Sequential(
            nn.Linear(d_model, w_rank, bias=False), nn.Linear(w_rank, d_model, bias=False))
        self.w_conv = ShortConv(d_model, conv_size)
        self.b_proj = nn.Linear(d_model, H, bias=True)
        self.f_proj = nn.Linear(d_model, H, bias=True) if self.forget_gate else None
        self.q_norm = nn.RMSNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(self.head_dim) if qk_norm else nn.Identity()
        self.o_proj = residual_linear(d_model, d_model)

    def init_extra(self):
        if self.f_proj is not None:  # as FoX: gates start near 1
            with torch.no_grad():
                self.f_proj.bias.copy_(torch.linspace(1.0, 5.0, self.n_heads))

    def forward(self, x, ctx=TRAINING):
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        q, k, v = self.qkv(x).view(B, T, 3, H, D).unbind(2)
        q, k = self.q_norm(q), self.k_norm(k)
        w = l2norm(up(self.w_conv(self.w_proj(x), ctx, "w_conv")).view(B, T, H, D))
        beta = 2 * torch.sigmoid(up(self.b_proj(x)))
        f = self.log_gate(x)
        q, k = self.rotate_qk(q, k, x, ctx)
        if ctx.state is None:
            o = path_attention(q, k, v, w, beta, f)
        elif ctx.static:
            o = self._static_step(q, k, v, w, beta, f, ctx)
        else:
            o = self._step(q, k, v, w, beta, f, ctx.state)
        # o is in q's dtype (FLA's kernel and the reference alike): no cast to x's, which under autocast was a
        # bf16 -> fp32 -> bf16 round trip
        return self.o_proj(o.reshape(B, T, self.d_model))

    def log_gate(self, x):
        return F.logsigmoid(up(self.f_proj(x))) if self.f_proj is not None else None

    def _step(self, q, k, v, w, beta, f, state):
        """Token by token through the state (prefill included): move cached keys by H_t, append k_t, attend."""
        scale = 1.0 / math.sqrt(self.head_dim)
        outs = []
        for t in range(q.shape[1]):
            kt, vt = up(k[:, t:t + 1]), v[:, t:t + 1]
            ct = (state.c[:, -1:] if state.c is not None else 0) + (f[:, t:t + 1] if f is not None else 0)
            if state.k is not None:
                moved = householder(state.k, w[:, t:t + 1], beta[:, t:t + 1])
                kt, vt = torch.cat([moved, kt], 1), torch.cat([state.v, vt], 1)
                ct = torch.cat([state.c, ct], 1) if f is not None else ct
            state.k, state.v = kt, vt
            if f is not None:
                state.c = ct
            s = torch.einsum("bhd,bjhd->bhj", up(q[:, t]), kt) * scale
            if f is not None:
                s = s + (ct[:, -1:] - ct).transpose(1, 2)
            outs.append(torch.einsum("bhj,bjhd->bhd", torch.softmax(s, -1), up(vt)))
        return torch.stack(outs, 1).to(q.dtype)

    def _static_step(self, q, k, v, w, beta, f, ctx):
        """One token into fixed buffers (ctx.static, model/decode.py): every cached key moved by H_t in place (the
        rows not yet written are zero and stay so), k_t written at its position, then attention over the buffer."""
        state = ctx.state
        state.k.copy_(householder(state.k, w, beta))
        c = None if f is None else f + state.c.index_select(1, (ctx.offset - 1).reshape(1))
        keys, values = extend_cache(ctx, k=up(k), v=v) if c is None else extend_cache(ctx, k=up(k), v=v, c=c)[:2]
        o = cached_attention(up(q), keys, up(values), ctx.offset, log_decay=None if c is None else state.c,
                             scale=1.0 / math.sqrt(self.head_dim))
        return o.to(q.dtype)

    def flops_per_token(self, seq_len):
        # scores and p.v as softmax attention, plus the Householder transforms of q (and k) inside the kernel
        return 2.0 * self.d_model * (seq_len + 1) + 8.0 * self.d_model * self.head_dim


@register("path")
class PaTH(_PaTH):
    forget_gate = False


@register("path_fox")
class PaTHFoX(_PaTH):
    forget_gate = True
