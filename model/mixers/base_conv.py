"""BaseConv (Arora et al. 2024, "Zoology"), the `base_conv` backbone: a gated short convolution.

    y_t = (sum_{i<K} w_i * x_{t-i} + c) * (x_t W + b) + x_t          (depthwise, kernel K = 3, no activation)

It has no state beyond the last K - 1 inputs and no positional scheme: it is the token-shift layer that Zoology puts
below every recurrent layer of its MQAR models (`model.layer_mixers=[base_conv,backbone]`: a "2-layer GLA" there is
one BaseConv block and one GLA block), which lets the next layer see each token's predecessor (key -> value pairs).
The inner "+ x_t" is Zoology's, on top of the block's own residual.
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.context import TRAINING
from ..core.layers import ShortConv
from .base import Mixer, register


@register("base_conv")
class BaseConv(Mixer):
    packable = True  # ShortConv restarts at each document

    def __init__(self, d_model, n_heads, pe=None, *, kernel_size: int = 3):
        super().__init__(d_model, n_heads, pe)
        if kernel_size < 1:
            raise ValueError(f"base_conv: kernel_size={kernel_size} must be >= 1")
        self.conv = ShortConv(d_model, kernel_size, activation=False)
        self.conv_bias = nn.Parameter(torch.zeros(d_model))
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x, ctx=TRAINING):
        return (self.conv(x, ctx) + self.conv_bias) * self.proj(x) + x

    def flops_per_token(self, seq_len):
        return 2.0 * self.d_model * self.conv.kernel_size
