"""Packed documents: one row [1, N, ...] holding several documents, with boundaries cu_seqlens [n_docs + 1]
(0 = cu_0 < cu_1 < ... = N). What every op's `cu_seqlens` argument means, the per-document definition the ops are
tested against, and the (document, chunk) tables the Triton kernels walk (shared by the rotation and attention
kernels)."""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without Triton use the references
    triton = None


def document_ids(cu_seqlens: torch.Tensor, n: int) -> torch.Tensor:
    """The document index of each of n packed tokens."""
    return torch.bucketize(torch.arange(n, device=cu_seqlens.device), cu_seqlens[1:], right=True)


def document_positions(cu_seqlens: torch.Tensor, n: int) -> torch.Tensor:
    """The position of each of n packed tokens within its own document (0 at each document's start)."""
    return torch.arange(n, device=cu_seqlens.device) - cu_seqlens[document_ids(cu_seqlens, n)]


def slice_boundaries(cu_seqlens: torch.Tensor, start: int, length: int) -> torch.Tensor:
    """The boundaries of a packed row as its slice [start, start + length) sees them (context parallelism), in the
    slice's coordinates: from the start of the document holding its first token (<= 0: minus that token's position
    in its document) through each document starting inside it, to `length`. document_positions of the result are
    the tokens' positions in their documents; its entries clamped at 0 are boundaries a kernel takes."""
    cu = cu_seqlens - start
    inside = cu[(cu > 0) & (cu < length)]
    return torch.cat([cu[cu <= 0].max()[None], inside, cu.new_tensor([length])])


def carried(cu_seqlens: torch.Tensor | None, T: int) -> torch.Tensor:
    """How many leading tokens of a slice continue a document begun on the slices before (cu_seqlens in the slice's
    coordinates, slice_boundaries; T without packed documents), as a 0-d tensor."""
    if cu_seqlens is None:
        return torch.tensor(T)
    return torch.where(cu_seqlens[0] < 0, cu_seqlens[1], 0)


def per_document(fn, cu_seqlens: torch.Tensor, *args) -> torch.Tensor:
    """fn on each document alone: tensor arguments [1, N, ...] are sliced along dim 1 (others pass through), the
    outputs are joined along dim 1. Reads the boundaries on the host (a sync)."""
    b = cu_seqlens.tolist()
    return torch.cat([fn(*(a[:, s:e] if torch.is_tensor(a) and a.dim() > 1 else a for a in args))
                      for s, e in zip(b[:-1], b[1:]) if e > s], 1)


def chunk_table(cu_seqlens, BT, device):
    """Packed input: the (document, chunk-within-document) pairs, each document's chunks consecutive."""
    cu = cu_seqlens.to(device=device, dtype=torch.int32)
    n_chunks = ((cu[1:] - cu[:-1] + BT - 1) // BT).long()
    doc = torch.repeat_interleave(torch.arange(len(n_chunks), device=device), n_chunks)
    idx = torch.arange(len(doc), device=device) - (torch.cumsum(n_chunks, 0) - n_chunks)[doc]
    return torch.stack([doc, idx], 1).to(torch.int32).contiguous(), cu



def block_table(cu_seqlens, BLOCK, device):
    """Packed input: one (document, block-within-document) row per program, blocks with the most keys first."""
    tab, cu = chunk_table(cu_seqlens, BLOCK, device)
    return tab[torch.argsort(tab[:, 1], descending=True, stable=True)].contiguous(), cu



if triton is not None:
    @triton.jit
    def chunk(c, chunk_tab, cu_seqlens, T, NT, BT: tl.constexpr, VARLEN: tl.constexpr):
        """Chunk c (flat index over all sequences): its first token t0, its document's end eos, its index i within
        the document and whether it is the document's last chunk."""
        if VARLEN:
            n = tl.load(chunk_tab + 2 * c)
            i = tl.load(chunk_tab + 2 * c + 1)
            bos = tl.load(cu_seqlens + n)
            eos = tl.load(cu_seqlens + n + 1)
        else:
            bos = (c // NT) * T
            i = c % NT
            eos = bos + T
        t0 = bos + i * BT
        return t0, eos, i, t0 + BT >= eos
