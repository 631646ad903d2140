"""DeltaNet (Schlag et al. 2021; Yang et al. 2024) and Gated DeltaNet (Yang et al. 2025): `deltanet`, `gated_deltanet`.

    q, k, v = SiLU(ShortConv(x W_q)), ...           (short causal convolutions, kernel 4)
    q, k    <- q / |q|, k / |k|                        (L2 normalised)
    beta_t  = sigmoid(x W_beta)                         in (0, 1)   (x2 with allow_neg_eigval: (0, 2))
    a_t     = exp(-exp(A_log) softplus(x W_a + dt_bias))  Mamba2's scalar decay (gated_deltanet only)
    S_t     = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t / sqrt(D)
    y       = W_o [RMSNorm(o_t) * silu(x W_g)]          (W_q, W_k, W_v, W_beta, W_a, W_g: one matmul)

The transition I - beta k k^T is a Householder-like matrix: its softmax dual is PaTH, and with the decay a_t,
PaTH-FoX (seed 000, sections 5-6). The incremental form keeps S and the convolutions' last inputs.
"""

from __future__ import annotations

import torch
from torch import nn

from duality.kernels.recurrences import delta_rule, delta_rule_step

from ..core.context import TRAINING
from ..core.layers import GatedOutput, ScalarDecay, ShortConv, l2norm, up
from .base import Mixer, register


class _DeltaNet(Mixer):
    pe_kinds = ("none", "absolute", "rotary")
    packable = True
    context_parallel = True  # the delta rule's state handed over (kernels/recurrences/cp.py), convolutions too
    gated = False

    def __init__(self, d_model, n_heads, pe=None, *, expand_v: float = 1.0, conv_size: int = 4,
                 allow_neg_eigval: bool = False, output_gate: bool = True):
        super().__init__(d_model, n_heads, pe)
        self.dk = self.head_dim
        self.dv = int(self.head_dim * expand_v)
        H = n_heads
        # every projection of x in one matmul, [q | k | v | beta | a (Gated DeltaNet) | output gate]: one gradient
        # into x instead of five (FLA's kernels split a compiled model into graphs, and summing the five between
        # them took 4% of a Gated DeltaNet step); q, k and v share one depthwise convolution (per channel, so the
        # same as three). Not split_linear as GLA: the convolution keeps [q | k | v] for backward, so the gate's view
        # keeps nothing that is not needed anyway. v stays a view (FLA's kernel copies it): convolving [q | k] and v
        # apart, to hand v over contiguous, saved no memory and at most 1% of the step (H200, 2026-11-28,
        # docs/throughput), for two launches and new kernel-config keys at every shape
        self.output_gate = output_gate
        self.sizes = [H * (2 * self.dk + self.dv), H, H if self.gated else 0, H * self.dv if output_gate else 0]
        self.in_proj = nn.Linear(d_model, sum(self.sizes), bias=False)
        self.conv = ShortConv(self.sizes[0], conv_size)
        self.beta_max = 2.0 if allow_neg_eigval else 1.0
        self.decay = ScalarDecay(H) if self.gated else None
        self.out = GatedOutput(d_model, H, self.dv)

    def forward(self, x, ctx=TRAINING):
        B, T, _ = x.shape
        H = self.n_heads
        qkv, b, a, gate = self.in_proj(x).split(self.sizes, -1)
        q, k, v = self.conv(qkv, ctx).split([H * self.dk, H * self.dk, H * self.dv], -1)
        if ctx.state is not None and T == 1 and x.is_cuda and self.fused_decoding:
            return self._fused_step(q.view(B, T, H, self.dk), k.view(B, T, H, self.dk), v.view(B, T, H, self.dv),
                                    b, a, gate, x, ctx)
        q, k, v = l2norm(q.view(B, T, H, self.dk)), l2norm(k.view(B, T, H, self.dk)), v.view(B, T, H, self.dv)
        beta = self.beta_max * torch.sigmoid(up(b))
        g = self.decay(a) if self.gated else None
        q, k = self.rotate_qk(q, k, x, ctx)
        o = self.recurrence(delta_rule, delta_rule_step, (q, k, v, beta, self.dk ** -0.5, g), ctx)
        return self.out(o, gate if self.output_gate else None)

    @property
    def fused_decoding(self) -> bool:
        """A decoding step may hand the L2 norms of q and k, beta's sigmoid and the decay to FLA's fused kernel
        (some 25 launches a layer fewer: 3.7 of GLA's 2.1 ms a step at 370m before, docs/inference.md): a rotation
        commutes with the norm, so any scheme that rotates q and k without reading them allows it."""
        pe = self.pe
        return pe is None or pe.name in ("rope", "learned_rotation") or getattr(pe, "source", None) == "x"

    def _fused_step(self, q, k, v, b, a, gate, x, ctx):
        from duality.kernels.recurrences.fla import delta_rule_step_fused
        q, k = self.rotate_qk(q, k, x, ctx)
        decay = self.decay
        o, ctx.state.S = delta_rule_step_fused(q, k, v, b, None if decay is None else a, self.dk ** -0.5,
                                               ctx.state.S, self.beta_max,
                                               None if decay is None else decay.A_log,
                                               None if decay is None else decay.dt_bias)
        return self.out(o.to(v.dtype), gate if self.output_gate else None)

    def log_gate(self, x):
        return self.decay(self.in_proj(x).split(self.sizes, -1)[2]) if self.gated else None

    def flops_per_token(self, seq_len):
        # S^T k, the rank-one update, S^T q (chunked WY kernels roughly double this; counted as the recurrence)
        return 6.0 * self.n_heads * self.dk * self.dv


@register("deltanet")
class DeltaNet(_DeltaNet):
    gated = False


@register("gated_deltanet")
class GatedDeltaNet(_DeltaNet):
    gated = True
