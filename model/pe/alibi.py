"""ALiBi (Press et al.): score_ij += -m_h (i - j), slopes m_h = 2^(-8h/H), h = 1..H.

Written as a cumulative log-decay with the constant per-head gate log a = -m_h: c_t = -m_h t, c_i - c_j = -m_h (i-j).
That is RetNet's fixed scalar decay gamma_h = exp(-m_h) seen from the softmax side (seed 000, section 2)."""

import torch

from .base import PositionalScheme, register


def alibi_slopes(n_heads: int) -> torch.Tensor:
    return torch.tensor([2.0 ** (-8.0 * h / n_heads) for h in range(1, n_heads + 1)])


@register("alibi")
class ALiBi(PositionalScheme):
    kind = "score"

    def __init__(self, dims):
        super().__init__(dims)
        self.register_buffer("slopes", alibi_slopes(dims.n_heads), persistent=False)

    def forward(self, q, k, *, offset: int = 0):
        t = torch.arange(k.shape[1], device=k.device, dtype=torch.float32)
        log_decay = -(t[:, None] * self.slopes.to(k.device)[None, :])[None]  # [1, Tk, H]
        return log_decay, None
