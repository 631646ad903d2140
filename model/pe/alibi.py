"""ALiBi (Press et al.): score_ij += -m_h (i - j), slopes m_h = 2^(-8h/H), h = 1..H.

A cumulative log-decay with the constant per-head gate log a = -m_h: c_t = -m_h t, c_i - c_j = -m_h (i-j). That is
RetNet's fixed scalar decay gamma_h = exp(-m_h) seen from the softmax side (seed 000, section 2), and FoX with a
constant forget gate (seed 003, appendix A.1). The slopes go to kernels/attention/ as they are, which computes
-m_h (i - j) from the positions (exact where c_t = -m_h t in fp32 would not be at t ~ 10^4)."""

import torch

from .base import PositionalScheme, register


def alibi_slopes(n_heads: int) -> torch.Tensor:
    return torch.tensor([2.0 ** (-8.0 * h / n_heads) for h in range(1, n_heads + 1)])


@register("alibi")
class ALiBi(PositionalScheme):
    kind = "score"
    context_parallel = True  # -m (i - j) from the positions, which the attention's context-parallel form keeps

    def __init__(self, dims):
        super().__init__(dims)
        self.register_buffer("slopes", alibi_slopes(dims.n_heads), persistent=False)

    def scores(self, q, k, ctx=None):
        return {"slopes": self.slopes.to(k.device)}
