"""What passes between the trunk, a mixer and its positional scheme.

    Dims        known before either is built: the scheme's parameters are shaped by it (no read-back from a mixer)
    Context     one per layer and call, trunk -> mixer -> scheme: where the tokens sit (offset, or packed documents
                with cu_seqlens) and, when decoding, the layer's state
    LayerState  what a layer carries from one decoding call to the next, as typed fields
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from duality.kernels.varlen import document_positions


@dataclass(frozen=True)
class Dims:
    d_model: int
    n_heads: int
    head_dim: int  # d_model / n_heads
    max_seq_len: int  # the training context
    qk_dim: int | None = None  # the q/k head size a rotary scheme rotates (GLA's differs); None: head_dim
    softmax: bool = False  # the mixer's scores go through a softmax (Selective RoPE then normalises q)

    @property
    def rotary_dim(self) -> int:
        return self.head_dim if self.qk_dim is None else self.qk_dim


@dataclass
class LayerState:
    """A layer's decoding state. Each field belongs to one kind of memory; a mixer or scheme fills the ones it has."""
    k: torch.Tensor | None = None  # KV cache [B, t, H, D] (softmax family; PaTH: keys already moved)
    v: torch.Tensor | None = None
    c: torch.Tensor | None = None  # running cumulative log forget gate [B, t, H] beside the KV cache
    S: object = None  # a linear recurrence's state (sympow's recurrent form: its tuple of states)
    conv: dict[str, torch.Tensor] = field(default_factory=dict)  # short convolutions' last K-1 inputs, by module
    phi: torch.Tensor | None = None  # an accumulated rotation's raw running angle Phi_t
    u: torch.Tensor | None = None  # Selective RoPE with skip_conv: the previous token's u


@dataclass(frozen=True)
class Context:
    """offset: absolute position of the first token (decoding continues at the tokens seen so far, a 0-d tensor when
    decoding into fixed buffers; under context parallelism, where this rank's slice starts); cu_seqlens: the row
    packs documents with these boundaries (positions restart at each); state: None in training; cp_group: the
    process group over which the sequence is split (None: the whole sequence is here)."""
    offset: int | torch.Tensor = 0
    cu_seqlens: torch.Tensor | None = None
    state: LayerState | None = None
    cp_group: object = None

    @property
    def static(self) -> bool:
        """Decoding into preallocated buffers (model/decode.py): the offset is a 0-d tensor on the model's device,
        so that one CUDA graph serves every step; KV caches are buffers of fixed length whose entries past the
        current token are not yet written (kernels/attention: cached_attention masks them)."""
        return isinstance(self.offset, torch.Tensor)

    def positions(self, T: int) -> torch.Tensor | None:
        """Each token's position within its document when packed, else None (positions offset .. offset+T-1)."""
        return None if self.cu_seqlens is None else document_positions(self.cu_seqlens, T)


TRAINING = Context()  # the whole sequence at once, from position 0, nothing to carry
