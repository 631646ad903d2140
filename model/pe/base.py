"""What every positional scheme is, and the registry that `conf/pe/*.yaml` names.

A scheme acts in one of four places (its `kind`), and a mixer lists the kinds it accepts:

    kind       acts on                                         e.g.
    none       nothing                                         nope
    absolute   the token embeddings, once, in the trunk        sinusoidal, learned
    rotary     q and k inside the mixer: forward(q, k, ...)    rope
    score      the attention scores: forward(q, k, offset) returns alibi, t5, xl
               decayed_attention's keyword arguments: a log-decay
               (slopes, log_decay) and/or a bias b_ij (kernels/attention.py)
    vo_rotary  the values (R_j v_j) and the output (R_t^T o_t) vo_rope

Relative schemes (rotary, score) are built once per layer and owned by that layer's mixer.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from torch import nn

from common.errors import ConfigError
from kernels.rotary import cumulative_rotation

KINDS = ("none", "absolute", "rotary", "score", "vo_rotary")
REGISTRY: dict[str, type["PositionalScheme"]] = {}


@dataclass(frozen=True)
class Dims:
    d_model: int
    n_heads: int
    head_dim: int
    max_seq_len: int


def register(name: str):
    def deco(cls):
        cls.name = name
        REGISTRY[name] = cls
        return cls
    return deco


class PositionalScheme(nn.Module):
    kind: str = "none"
    name: str = "?"
    max_positions: int | None = None  # positions it can represent (None: any)

    def __init__(self, dims: Dims):
        super().__init__()
        self.dims = dims

    def bind(self, mixer) -> None:
        """Called once the owning mixer exists: a scheme with parameters shaped by the mixer (its q/k head size,
        whether it is softmax attention) creates them here. Most schemes need nothing."""


class AccumulatedRotation(PositionalScheme):
    """A rotary scheme whose angles accumulate data-dependent increments, phi_t = theta * (phi_0 + sum_{s<=t}
    dphi_s) (kernels/rotary.py): a subclass sets `theta` in bind() and gives `increments(q, x, cache)`, [B, T, H, D/2]
    or [B, T, H, 1]. Decoding caches the running angle."""
    kind = "rotary"

    def increments(self, q, x, cache=None):
        raise NotImplementedError

    def forward(self, q, k, *, offset: int = 0, x=None, cache=None):
        if not hasattr(self, "theta"):
            raise RuntimeError(f"pe={self.name} was not bound to a mixer (build models with model.build_model)")
        dphi = self.increments(q, x, cache)
        phi0 = None if cache is None else cache.get("phi")
        q, k, phi_T = cumulative_rotation(q, k, dphi, self.theta, phi0=phi0)
        if cache is not None:
            cache["phi"] = phi_T
        return q, k


def check_options(cls, options: dict, what: str) -> None:
    """Unknown config keys are an error naming the valid ones (no silent ignoring)."""
    params = inspect.signature(cls.__init__).parameters
    valid = [p for p, v in params.items() if v.kind == inspect.Parameter.KEYWORD_ONLY]
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
