"""Transformer-XL relative attention (Dai et al. 2019). For query i and key j, with r = i - j:

    S_ij = q_i.k_j  +  q_i.R_r  +  u.k_j  +  v.R_r          (all times 1/sqrt(d_head))
           content    content-   global    global
                      position   content   position

R_r = W_R sinusoid(r) is a projected sinusoidal embedding of the distance (per head), and u, v are learned
per-head global vectors. The first term is the mixer's own q.k; this scheme returns the other three as a bias."""

import math

import torch
from torch import nn

from .base import PositionalScheme, register
from .sinusoidal import sinusoid_table


@register("xl")
class TransformerXL(PositionalScheme):
    kind = "score"
    packable = False
    context_parallel = True  # the bias against the gathered keys (kernels/attention/cp.py: bias_for)
    score_bias = True

    def __init__(self, dims, *, base: float = 10000.0):
        super().__init__(dims)
        self.base = base
        self.W_R = nn.Linear(dims.d_model, dims.n_heads * dims.head_dim, bias=False)
        self.u = nn.Parameter(torch.zeros(dims.n_heads, dims.head_dim))
        self.v = nn.Parameter(torch.zeros(dims.n_heads, dims.head_dim))

    def scores(self, q, k, ctx=None):
        B, Tq, H, D = q.shape
        Tk = k.shape[1]
        r = torch.arange(Tk, device=q.device)
        R = self.W_R(sinusoid_table(r, self.dims.d_model, self.base).to(self.W_R.weight.dtype)).view(Tk, H, D)
        pos = torch.einsum("bihd,rhd->bhir", q + self.v.to(q.dtype), R.to(q.dtype))  # [B, H, Tq, Tk(distance)]
        i = torch.arange(Tk - Tq, Tk, device=q.device)[:, None]
        dist = (i - torch.arange(Tk, device=q.device)[None, :]).clamp(min=0)  # masked entries read distance 0
        pos = torch.gather(pos, 3, dist.expand(B, H, Tq, Tk))
        glob = torch.einsum("hd,bjhd->bhj", self.u.to(k.dtype), k)[:, :, None, :]
        return {"bias": (pos + glob) / math.sqrt(D)}
