"""Packed documents: one row [1, N, ...] holding several documents, with boundaries cu_seqlens [n_docs + 1]
(0 = cu_0 < cu_1 < ... = N). What the kernels' `cu_seqlens` arguments mean, and the per-document definition they
are tested against."""

from __future__ import annotations

import torch


def document_ids(cu_seqlens: torch.Tensor, n: int) -> torch.Tensor:
    """The document index of each of n packed tokens."""
    return torch.bucketize(torch.arange(n, device=cu_seqlens.device), cu_seqlens[1:], right=True)


def document_positions(cu_seqlens: torch.Tensor, n: int) -> torch.Tensor:
    """The position of each of n packed tokens within its own document (0 at each document's start)."""
    return torch.arange(n, device=cu_seqlens.device) - cu_seqlens[document_ids(cu_seqlens, n)]


def per_document(fn, cu_seqlens: torch.Tensor, *args) -> torch.Tensor:
    """fn on each document alone: tensor arguments [1, N, ...] are sliced along dim 1 (others pass through), the
    outputs are joined along dim 1. Reads the boundaries on the host (a sync)."""
    b = cu_seqlens.tolist()
    return torch.cat([fn(*(a[:, s:e] if torch.is_tensor(a) and a.dim() > 1 else a for a in args))
                      for s, e in zip(b[:-1], b[1:]) if e > s], 1)
