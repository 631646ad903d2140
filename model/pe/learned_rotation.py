"""Learned (data-dependent) rotation (seed 003 section 3.2): RoPE's rates, scaled per token and head.

    theta_i  = 2 pi / N^(2i/d),  i = 0 .. d/2 - 1       N: the longest document (`max_len`; default the model's
                                                       seq_len), d: the mixer's q/k head size
    beta_t   = 1 + tanh(x_t W_beta)  in (0, 2)          one per head, from the block input
    mu_t     = mu_{t-1} + beta_t theta                  the rotation accumulated up to t
    q_t, k_t = R(mu_t) q_t, R(mu_t) k_t                 so q_i.k_j sees R(theta sum_{s=j+1..i} beta_s)

A cumulative rotation whose increment beta_t is broadcast over the channel pairs (kernels/rotary/); beta = 1 is
RoPE with base N (times 2 pi). The model may speed a head's clock up to twice or stop it. Channels pair as
(x_i, x_{i+d/2}) rather than the paper's adjacent (x_2i, x_2i+1): a fixed permutation of q's and k's channels, which
the projections absorb. With a forget gate it makes conformal-sympow (seed 003 section 3.3).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from duality.kernels.rotary import rope_frequencies

from ..core.layers import up
from .base import AccumulatedRotation, ConfigError, register


@register("learned_rotation")
class LearnedRotation(AccumulatedRotation):
    def __init__(self, dims, *, max_len: int | None = None):
        super().__init__(dims)
        self.max_len = dims.max_seq_len if max_len is None else max_len
        if not (isinstance(self.max_len, int) and self.max_len > 1):
            raise ConfigError(f"pe=learned_rotation: max_len must be an integer > 1 (N, the longest document), "
                              f"got {max_len!r}")
        D = self.rotary_dim()
        self.beta = nn.Linear(dims.d_model, dims.n_heads, bias=False)
        self.register_buffer("theta", (2 * math.pi * rope_frequencies(D, self.max_len)).float(), persistent=False)

    def increments(self, q, x, ctx=None):
        if x is None:
            raise ValueError("pe=learned_rotation needs the block input x")
        return 1 + torch.tanh(up(self.beta(x)))[..., None]  # beta_t [B, T, H, 1], fp32 at least
