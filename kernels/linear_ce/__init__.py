"""Fused linear + cross-entropy: the mean next-token loss of logits z = h W^T without ever holding all of z.

    loss   = (1/n) sum_t [ logsumexp_v z_tv - z_{t,y_t} ]      over the n tokens with y_t != ignore_index
    dL/dz_t = (softmax(z_t) - onehot(y_t)) / n,    dL/dh = (dL/dz) W,    dL/dW = (dL/dz)^T h

The logits of 32 x 1024 tokens over a 50k vocabulary are 6.6 GB in fp32 (3.3 GB more for their gradient). Here the
tokens go through in chunks: each chunk's logits exist only while its loss and its two gradient products are formed,
during the forward pass, and backward scales the stored gradients by the incoming scalar. Same matmuls as the plain
path (one forward, two backward), so no extra FLOPs; the extra memory is one chunk of logits.

    reference.py   all logits at once        chunked.py   the chunked forward/backward (cuBLAS matmuls)
    kernel.py      one chunk's loss and logit gradient in one Triton kernel, over the logits in place (CUDA default)
"""

from __future__ import annotations

import torch

from .chunked import CHUNK_ELEMENTS, _LinearCrossEntropy, _loss_and_grad
from .kernel import triton
from .reference import linear_cross_entropy_reference

__all__ = ["CHUNK_ELEMENTS", "IMPLS", "linear_cross_entropy", "linear_cross_entropy_reference"]

IMPLS = ("auto", "triton", "chunked")  # what model.fused_loss_impl chooses; impl="torch" is the reference


def _chunked(h, weight, targets, ignore_index, grad: bool, kernel: bool):
    if grad:
        return _LinearCrossEntropy.apply(h, weight, targets, ignore_index, kernel)
    return _loss_and_grad(h, weight, targets, ignore_index, with_grad=False, kernel=kernel)[0]


# Outside Dynamo: a compiled model calls the kernel's path between two graphs (as it calls FLA's kernels); its
# matmuls are cuBLAS's either way, and the kernel is what Inductor's fusion of the chunked path would be
_chunked_outside_dynamo = torch.compiler.disable(_chunked)


def linear_cross_entropy(h, weight, targets, ignore_index: int = -1, impl: str | None = None):
    """Mean cross-entropy of h [N, d] @ weight [V, d]^T against targets [N] (ignore_index skipped).
    Under autocast the matmuls run in the autocast dtype, as a plain nn.Linear would; the loss is fp32.
    impl: "chunked" (each chunk's loss in PyTorch), "triton" (by kernel.py's kernel), "torch" (the reference), or
    None / "auto": the kernel on CUDA, the chunked path elsewhere."""
    if h.dim() != 2 or weight.dim() != 2 or h.shape[1] != weight.shape[1] or targets.shape != h.shape[:1]:
        raise ValueError(f"linear_cross_entropy: h [N, d], weight [V, d], targets [N]; got {tuple(h.shape)}, "
                         f"{tuple(weight.shape)}, {tuple(targets.shape)}")
    if impl == "torch":
        return linear_cross_entropy_reference(h, weight, targets, ignore_index)
    if impl not in (None, *IMPLS):
        raise ValueError(f"linear_cross_entropy: impl must be one of {[*IMPLS, 'torch']} or None, got {impl!r}")
    if impl in (None, "auto"):
        impl = "triton" if h.is_cuda and triton is not None else "chunked"
    if impl == "triton" and triton is None:
        raise ValueError("linear_cross_entropy: impl='triton' needs the triton package; impl='chunked' runs without")
    dev = h.device.type
    autocast = torch.is_autocast_enabled(dev)
    dtype = torch.get_autocast_dtype(dev) if autocast else torch.promote_types(h.dtype, weight.dtype)
    h = h.to(dtype)  # the cast carries dL/dh back to the caller's dtype
    grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    with torch.autocast(dev, enabled=False):
        kernel = impl == "triton"
        return (_chunked_outside_dynamo if kernel else _chunked)(h, weight, targets, ignore_index, grad, kernel)
