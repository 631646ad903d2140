"""The plain loss (kernels/linear_ce/__init__.py): all logits at once; the oracle."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear_cross_entropy_reference(h, weight, targets, ignore_index: int = -1):
    """Plain formula: the logits in full, in fp32 (or float64)."""
    z = h @ weight.T
    return F.cross_entropy(z.to(torch.promote_types(z.dtype, torch.float32)), targets, ignore_index=ignore_index)
