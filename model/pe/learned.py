"""Learned absolute embedding: a [max_seq_len, d] table P added to the token embeddings, x_t <- x_t + P_t.
It cannot represent positions past max_seq_len (the training context): asking for one is an error."""

import torch
from torch import nn

from ..core.context import TRAINING
from .base import PositionalScheme, register


@register("learned")
class Learned(PositionalScheme):
    context_parallel = True  # positions from ctx.offset (packed: ctx.positions)
    kind = "absolute"

    def __init__(self, dims, *, init_std: float = 0.02):
        super().__init__(dims)
        self.table = nn.Parameter(torch.randn(dims.max_seq_len, dims.d_model) * init_std)
        self.max_positions = dims.max_seq_len

    def embed(self, x, ctx=TRAINING):
        T, offset, pos = x.shape[1], ctx.offset, ctx.positions(x.shape[1])  # packed documents: each from 0
        if ctx.static:  # fixed decoding buffers: model/decode.py checked their length against the table's
            return x + self.table[offset + torch.arange(T, device=x.device)].to(x.dtype)
        last = offset + T - 1 if pos is None else int(pos.max())
        if last >= self.table.shape[0]:
            raise ValueError(f"pe=learned has {self.table.shape[0]} positions; asked for position {last}. "
                             "Learned embeddings cannot extrapolate: use a relative scheme for longer contexts.")
        return x + (self.table[offset:offset + T] if pos is None else self.table[pos]).to(x.dtype)
