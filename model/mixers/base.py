"""The token-mixer interface and the registry that `conf/backbone/*.yaml` names.

A mixer maps x [B, T, d_model] -> y [B, T, d_model] causally, in two forms that must agree:

    forward(x)              parallel form over the whole sequence (training).
    forward(x, cache=dict)  incremental form (generation): continue from the state stored in `cache` (an empty dict
                            at the start of a sequence), write the new state back. Any T works, so a prompt is
                            prefilled in one call and each new token is a call with T = 1. Softmax attention keeps
                            a KV cache (memory grows with t); a linear recurrence keeps its fixed-size state S_t.

Each mixer declares which positional-scheme kinds it accepts (`pe_kinds`, see model/pe/base.py); the relative
schemes it accepts are built per layer and handed to its constructor. Options in the backbone yaml map one-to-one
onto the constructor's keyword-only arguments.
"""

from __future__ import annotations

from torch import nn

from kernels.documents import document_positions

REGISTRY: dict[str, type["Mixer"]] = {}


def register(name: str):
    def deco(cls):
        cls.name = name
        REGISTRY[name] = cls
        return cls
    return deco


def residual_linear(d_in: int, d_out: int) -> nn.Linear:
    """A projection that writes into the residual stream: the trunk gives it the scaled init std/sqrt(2 n_layer)."""
    lin = nn.Linear(d_in, d_out, bias=False)
    lin.is_residual = True
    return lin


class Mixer(nn.Module):
    name: str = "?"
    pe_kinds: tuple[str, ...] = ("none",)
    softmax: bool = False  # scores go through a softmax (Selective RoPE then L2-normalises q for its angles)
    # the packed schemes this mixer's forward(x, cu_seqlens=...) handles itself (kernels take document boundaries);
    # with any other scheme the trunk runs it per document (kernels.documents.per_document)
    packed_schemes: tuple[str, ...] = ()

    @property
    def packed(self) -> bool:
        return (self.pe.name if self.pe is not None else "nope") in self.packed_schemes

    def __init__(self, d_model: int, n_heads: int, pe=None):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} does not divide d_model={d_model}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.pe = pe

    @property
    def qk_head_dim(self) -> int:
        """Size of the q/k vectors a rotary scheme rotates (GLA's key dim can differ from d_model / n_heads)."""
        return getattr(self, "dk", self.head_dim)

    def forward(self, x, cache: dict | None = None):
        raise NotImplementedError

    def log_gate(self, x):
        """log a_t [B, T, H] of the mixer's forget gate (a per-channel gate is averaged over its channels), None
        without one: the log-decay whose cumulative sum c gives the weight exp(c_i - c_j) of token j at step i. The
        kernel pictures of eval.py (mode=kernel) draw it beside the positional schemes' biases and rotations."""
        return None

    def flops_per_token(self, seq_len: int) -> float:
        """Forward FLOPs per token spent outside parameter matmuls (the trunk counts those as 2 * params)."""
        raise NotImplementedError

    def recurrence(self, parallel, step, args, cache, offset, cu_seqlens=None):
        """The three forms of a linear recurrence `parallel(*args, S0=, output_state=)` / `step(*args, S0=)`:
        training (parallel, no state; packed documents with cu_seqlens), decoding (one recurrent step from the
        cached state S), prefill (parallel form continuing from and returning S)."""
        if cache is None:
            return parallel(*args, cu_seqlens=cu_seqlens)[0] if cu_seqlens is not None else parallel(*args)[0]
        T = args[0].shape[1]
        if T == 1:
            o, S = step(*args, S0=cache.get("S"))
        else:
            o, S = parallel(*args, S0=cache.get("S"), output_state=True)
        cache.update(S=S, offset=offset + T)
        return o

    def rotate_qk(self, q, k, x, cache, offset, cu_seqlens=None):
        """Apply a rotary scheme, if any, to q and k [B, T, H, D] at absolute positions offset.. (packed input: at
        each token's position within its document)."""
        if self.pe is not None and self.pe.kind == "rotary":
            if cu_seqlens is not None:
                return self.pe(q, k, positions=document_positions(cu_seqlens, q.shape[1]))
            pe_cache = None if cache is None else cache.setdefault("pe", {})
            q, k = self.pe(q, k, offset=offset, x=x, cache=pe_cache)
        return q, k
