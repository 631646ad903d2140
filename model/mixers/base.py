"""The token-mixer interface and the registry that `conf/backbone/*.yaml` names.

A mixer maps x [B, T, d_model] -> y [B, T, d_model] causally, with one signature, forward(x, ctx), in three forms
that must agree (model/core/context.py):

    ctx = TRAINING               parallel form over the whole sequence
    ctx.cu_seqlens               packed documents (only where `packable`: its kernels take the boundaries; else the
                                 trunk runs it per document)
    ctx.state                    incremental form (generation): continue from the LayerState at position
                                 ctx.offset and write the new state back. Any T works, so a prompt is prefilled in
                                 one call and each new token is a call with T = 1. Softmax attention keeps a KV
                                 cache (memory grows with t); a linear recurrence keeps its fixed-size state S_t.

Each mixer declares where a positional scheme may act on it (`pe_kinds`, see model/pe/base.py) and calls the
scheme's hooks there: the same calls whatever the scheme, so a new scheme needs no mixer change. The relative scheme
of a layer is built from Dims (known before the mixer: `qk_dim` says the q/k size) and handed to the constructor.
Options in the backbone yaml map one-to-one onto the constructor's keyword-only arguments.
"""

from __future__ import annotations

import torch
from torch import nn

from duality.kernels.attention import cached_attention, cumulative_log_decay, decayed_attention
from duality.kernels.attention.cp import decayed_attention_cp
from duality.kernels.recurrences import delta_rule, gated, oja
from duality.kernels.recurrences.cp import delta_rule_cp, gated_cp, oja_cp

from ..core.context import TRAINING, Context

# the recurrences that run on a sequence split across ranks (kernels/recurrences/cp.py), by their whole-sequence form
CONTEXT_PARALLEL = {gated: gated_cp, delta_rule: delta_rule_cp, oja: oja_cp}

REGISTRY: dict[str, type["Mixer"]] = {}


def register(name: str):
    def deco(cls):
        cls.name = name
        REGISTRY[name] = cls
        return cls
    return deco


class Mixer(nn.Module):
    name: str = "?"
    pe_kinds: tuple[str, ...] = ("none",)
    softmax: bool = False  # scores go through a softmax (Selective RoPE then L2-normalises q for its angles)
    packable: bool = False  # forward(x, ctx) takes ctx.cu_seqlens in its kernels (with a scheme that is packable too)
    context_parallel: bool = False  # forward(x, ctx) with ctx.cp_group: a slice of the sequence (kernels/.../cp.py)

    def __init__(self, d_model: int, n_heads: int, pe=None):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} does not divide d_model={d_model}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.pe = pe

    @classmethod
    def qk_dim(cls, d_model: int, n_heads: int, **options) -> int:
        """The q/k head size for these options, before anything is built (a rotary scheme's size)."""
        return d_model // n_heads

    @property
    def packed(self) -> bool:
        """Whether the trunk hands this layer packed documents (else it runs it per document)."""
        return self.packable and (self.pe is None or self.pe.packable)

    def forward(self, x, ctx: Context = TRAINING):
        raise NotImplementedError

    def log_gate(self, x):
        """log a_t [B, T, H] of the mixer's forget gate (a per-channel gate is averaged over its channels), None
        without one: the log-decay whose cumulative sum c gives the weight exp(c_i - c_j) of token j at step i. The
        kernel pictures of eval.py (mode=kernel) draw it beside the positional schemes' biases and rotations."""
        return None

    def flops_per_token(self, seq_len: int) -> float:
        """Forward FLOPs per token spent outside parameter matmuls (the trunk counts those as 2 * params)."""
        raise NotImplementedError

    # the scheme's hooks, where a mixer calls them (identity without a relative scheme)
    def rotate_qk(self, q, k, x, ctx: Context):
        return (q, k) if self.pe is None else self.pe.rotate(q, k, x, ctx)

    def scores(self, q, k, ctx: Context) -> dict:
        return {} if self.pe is None else self.pe.scores(q, k, ctx)

    def rotate_values(self, v, ctx: Context):
        return v if self.pe is None else self.pe.rotate_values(v, ctx)

    def rotate_output(self, o, ctx: Context):
        return o if self.pe is None else self.pe.rotate_output(o, ctx)

    @staticmethod
    def recurrence(parallel, step, args, ctx: Context):
        """The three forms of a linear recurrence `parallel(*args, S0=, output_state=)` / `step(*args, S0=)`:
        training (parallel, no state; packed documents with cu_seqlens), decoding (one recurrent step from the
        state S), prefill (parallel form continuing from and returning S)."""
        state = ctx.state
        if ctx.cp_group is not None:  # this rank holds one slice of the sequence: the state is handed over
            if parallel not in CONTEXT_PARALLEL:
                raise ValueError(f"no context-parallel form of {parallel.__name__}; those with one: "
                                 f"{sorted(f.__name__ for f in CONTEXT_PARALLEL)}")
            o = CONTEXT_PARALLEL[parallel](*args, group=ctx.cp_group, cu_seqlens=ctx.cu_seqlens)
        elif state is None:
            o = parallel(*args, cu_seqlens=ctx.cu_seqlens)[0] if ctx.cu_seqlens is not None else parallel(*args)[0]
        elif args[0].shape[1] == 1:
            o, state.S = step(*args, S0=state.S)
        else:
            o, state.S = parallel(*args, S0=state.S, output_state=True)
        # in v's dtype, as FLA's kernels return it: the references accumulate in fp32, and an fp32 output met a
        # bf16 output projection on a GPU (FLA's norm-gate keeps its input's dtype: issue #73)
        return o.to(args[2].dtype)


def extend_cache(ctx: Context, **new):
    """Append this call's entries (k, v, c: [B, T, ...]) to the layer's KV cache and return the whole cache, in
    keyword order. Growing caches are concatenated; fixed buffers (ctx.static, model/decode.py) are written in place
    at positions offset .. offset+T-1 (a CUDA graph replays the same writes at the next position)."""
    state = ctx.state
    if ctx.static:
        at = ctx.offset + torch.arange(next(iter(new.values())).shape[1], device=ctx.offset.device)
        for name, x in new.items():
            getattr(state, name).index_copy_(1, at, x.to(getattr(state, name).dtype))
        return tuple(getattr(state, name) for name in new)
    out = tuple(x if getattr(state, name) is None else torch.cat([getattr(state, name), x], 1)
                for name, x in new.items())
    for name, x in zip(new, out):
        setattr(state, name, x)
    return out


def gated_attention(q, k, v, log_gate, ctx: Context, power: int | None = None):
    """Softmax (power None) or symmetric-power attention with a forget gate (log_gate [B, T, H], or None), c the
    cumulative sum of the gate: the training form over the whole sequence, or with a KV cache (keys, values and the
    running c) for generation: FoX and sympow."""
    c = None if log_gate is None else cumulative_log_decay(log_gate)
    state = ctx.state
    if state is not None:
        if c is not None and state.c is not None:  # continue the running sum from the last cached token's
            c = c + (state.c.index_select(1, (ctx.offset - 1).reshape(1)) if ctx.static else state.c[:, -1:])
        if c is None:
            k, v = extend_cache(ctx, k=k, v=v)
        else:
            k, v, c = extend_cache(ctx, k=k, v=v, c=c)
    return attention(q, k, v, ctx, log_decay=c, power=power)


def attention(q, k, v, ctx: Context, **scores):
    """decayed_attention over the context's tokens: the whole sequence (packed documents with cu_seqlens, keys
    from a KV cache; a fixed buffer of keys when ctx.static, cached_attention), or under context parallelism this
    rank's queries against the keys of every slice up to its own (kernels/attention/cp.py)."""
    if ctx.static:
        return cached_attention(q, k, v, ctx.offset, **scores)
    if ctx.cp_group is None:
        return decayed_attention(q, k, v, cu_seqlens=ctx.cu_seqlens, **scores)
    if scores.get("bias") is not None:  # a bias spans the keys of every slice: scores(keys)["bias"] is asked for
        raise ValueError("attention over a split sequence takes a score scheme's bias as bias_for(keys)")
    return decayed_attention_cp(q, k, v, group=ctx.cp_group, cu_seqlens=ctx.cu_seqlens, **scores)
