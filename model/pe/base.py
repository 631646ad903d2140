"""What every positional scheme is, and the registry that `conf/pe/*.yaml` names.

A scheme acts in one of these places (its `kind`), through the hook named there; every other hook is the identity.
A mixer lists the kinds it accepts and calls the hooks of those places whatever the scheme, so adding a scheme
changes no mixer (tests/test_model.py builds one in the test):

    kind       acts on                                         hook                                  e.g.
    none       nothing                                         -                                     nope
    absolute   the token embeddings, once, in the trunk        embed(x, ctx) -> x                    sinusoidal
    rotary     q and k inside the mixer                        rotate(q, k, x, ctx) -> q, k          rope
    score      the attention scores: keyword arguments of      scores(q, k, ctx) -> dict             alibi, t5, xl
               decayed_attention, a log-decay (slopes,
               log_decay) and/or a bias b_ij (kernels/attention/)
    vo_rotary  the values (R_j v_j) and the output (R_t^T o_t) rotate_values(v, ctx), rotate_output  vo_rope

A scheme is built from Dims (model/core/context.py), known before its mixer; relative schemes (rotary, score,
vo_rotary) are built once per layer and owned by that layer's mixer. `packable`: the scheme places tokens by
ctx.positions() in packed rows (else the trunk runs a packed row one document at a time).
"""

from __future__ import annotations

import torch
from torch import nn

from duality.common.errors import ConfigError
from duality.kernels.cp import hand_over
from duality.kernels.rotary import cumulative_rotation
from duality.kernels.varlen import carried

from ..core.context import TRAINING, Context, Dims
from ..core.options import options as core_options

KINDS = ("none", "absolute", "rotary", "score", "vo_rotary")
REGISTRY: dict[str, type["PositionalScheme"]] = {}


def register(name: str):
    def deco(cls):
        cls.name = name
        REGISTRY[name] = cls
        return cls
    return deco


class PositionalScheme(nn.Module):
    kind: str = "none"
    name: str = "?"
    packable: bool = True
    context_parallel: bool = False  # right on a slice of the sequence that starts at ctx.offset
    score_bias: bool = False  # scores() gives an additive "bias" over (query, key) pairs (T5, Transformer-XL)
    max_positions: int | None = None  # positions it can represent (None: any)

    def __init__(self, dims: Dims):
        super().__init__()
        self.dims = dims

    def embed(self, x, ctx: Context = TRAINING):
        return x

    def rotate(self, q, k, x=None, ctx: Context = TRAINING):
        return q, k

    def scores(self, q, k, ctx: Context = TRAINING) -> dict:
        return {}

    def rotate_values(self, v, ctx: Context = TRAINING):
        return v

    def rotate_output(self, o, ctx: Context = TRAINING):
        return o

    def rotary_dim(self) -> int:
        """The q/k head size this scheme rotates; an error if it has no channel pairs."""
        D = self.dims.rotary_dim
        if D % 2:
            raise ConfigError(f"pe={self.name} rotates channel pairs: the q/k head size {D} must be even")
        return D


class AccumulatedRotation(PositionalScheme):
    """A rotary scheme whose angles accumulate data-dependent increments, phi_t = theta * (phi_0 + sum_{s<=t}
    dphi_s) (kernels/rotary/): a subclass sets `theta` and gives `increments(q, x, ctx)`, [B, T, H, D/2] or
    [B, T, H, 1], each document's from its own tokens when packed (the angle restarts at each document in the
    kernel). Decoding keeps the running angle in ctx.state.phi. On a slice of a sequence split over ranks
    (ctx.cp_group) the slices before add their sums of increments to the first token's, in fp32: the angle carries
    over, and its gradient goes back to the ranks that made it. Packed, only the increments since the first token's
    document began count: a slice holding a boundary passes on the sum of its last document's alone."""
    kind = "rotary"
    context_parallel = True

    def increments(self, q, x, ctx: Context = TRAINING):
        raise NotImplementedError

    def rotate(self, q, k, x=None, ctx: Context = TRAINING):
        dphi = self.increments(q, x, ctx)
        cu = ctx.cu_seqlens
        if ctx.cp_group is not None:
            dphi = dphi.float()
            T, n = dphi.shape[1], carried(cu, dphi.shape[1]).to(dphi.device)
            tail = dphi if cu is None else dphi * (torch.arange(T, device=dphi.device) >= cu[-2])[:, None, None]
            # each slice passes on its last document's sum, and the sums before only if no document starts in it
            before = hand_over((n == T).to(dphi.dtype), tail.sum(1), ctx.cp_group, torch.mul)  # [B, H, D/2 or 1]
            dphi = torch.cat([dphi[:, :1] + before[:, None] * (n > 0), dphi[:, 1:]], 1)
            cu = None if cu is None else cu.clamp(min=0)
        state = ctx.state
        q, k, phi_T = cumulative_rotation(q, k, dphi, self.theta, phi0=None if state is None else state.phi,
                                          cu_seqlens=cu)
        if state is not None:
            state.phi = phi_T
        return q, k


def check_options(cls, options: dict, what: str) -> None:
    """Unknown config keys are an error naming the valid ones (no silent ignoring; a config composed by Hydra was
    already checked against the same list, model/core/options.py, but a model can be built from a plain dict)."""
    valid = core_options(cls)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ConfigError(f"{what}: unknown option(s) {unknown}; valid options: {sorted(valid) or 'none'}")


def build_pe(cfg: dict, dims: Dims) -> PositionalScheme:
    options = {k: v for k, v in dict(cfg).items() if k != "name"}
    name = cfg.get("name")
    if name not in REGISTRY:
        raise ConfigError(f"unknown positional scheme pe={name!r}; valid choices: {sorted(REGISTRY)}")
    cls = REGISTRY[name]
    check_options(cls, options, f"pe={name}")
    return cls(dims, **options)
