"""T5 relative bias (Raffel et al.): score_ij += b_h[bucket(i - j)], learned per head and per layer.

Causal bucketing: distances n < num_buckets/2 get their own bucket; larger ones share logarithmically spaced
buckets up to max_distance, beyond which all distances share the last bucket."""

import math

import torch
from torch import nn

from .base import PositionalScheme, register


def t5_bucket(n: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """n = i - j >= 0 (causal) -> bucket index in [0, num_buckets)."""
    exact = num_buckets // 2
    n = n.clamp(min=0)
    log_part = exact + (torch.log(n.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                        * (num_buckets - exact)).long()
    return torch.where(n < exact, n, log_part.clamp(max=num_buckets - 1))


@register("t5")
class T5Bias(PositionalScheme):
    kind = "score"
    packable = False
    context_parallel = True  # the bias against the gathered keys (kernels/attention/cp.py: bias_for)
    score_bias = True

    def __init__(self, dims, *, num_buckets: int = 32, max_distance: int = 128):
        super().__init__(dims)
        if num_buckets < 2 or max_distance <= num_buckets // 2:
            raise ValueError("pe=t5 needs num_buckets >= 2 and max_distance > num_buckets/2")
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.table = nn.Parameter(torch.zeros(num_buckets, dims.n_heads))

    def scores(self, q, k, ctx=None):
        Tq, Tk = q.shape[1], k.shape[1]
        i = torch.arange(Tk - Tq, Tk, device=q.device)[:, None]
        j = torch.arange(Tk, device=q.device)[None, :]
        b = self.table[t5_bucket(i - j, self.num_buckets, self.max_distance)]  # [Tq, Tk, H]
        return {"bias": b.permute(2, 0, 1)[None]}
