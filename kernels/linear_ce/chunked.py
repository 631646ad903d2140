"""The chunked loss and its autograd wrapper (kernels/linear_ce/__init__.py): cuBLAS matmuls over chunks of tokens,
each chunk's loss and logit gradient formed by plain PyTorch (the CPU path, and what Inductor fuses when compiled) or
by one Triton kernel over the logits in place (kernel.py, the CUDA default)."""

from __future__ import annotations

import torch

from .kernel import ce_rows

CHUNK_ELEMENTS = 1 << 29  # logits per chunk (2 GiB in fp32, 1 GiB in bf16 for the kernel): 10,496 tokens of a 50k
# vocabulary; smaller chunks (2,560 tokens) cost 2 ms per 32k-token step on an H100 (smaller matmuls, more launches)


def _chunks(n: int, vocab: int) -> int:
    return max(256, CHUNK_ELEMENTS // vocab // 256 * 256) if n * vocab > CHUNK_ELEMENTS else max(n, 1)  # n = 0: no rows


def _loss_and_grad(h, weight, targets, ignore_index, with_grad: bool, kernel: bool = False):
    """h is in the compute dtype; weight may be wider (fp32 master weights): dW is accumulated and returned in its
    dtype, never rounded to bf16 on the way. kernel: each chunk's loss and gradient by kernel.py's ce_rows."""
    n_tokens, vocab = h.shape[0], weight.shape[0]
    acc = torch.promote_types(h.dtype, torch.float32)  # logits, loss and dW accumulate in fp32 (or float64)
    w = weight.to(h.dtype)
    valid = targets != ignore_index
    n = valid.sum().clamp(min=1).to(acc)  # a tensor: no host sync
    loss = torch.zeros((), device=h.device, dtype=acc)
    gh = torch.empty_like(h) if with_grad else None
    gw = torch.zeros(weight.shape, device=h.device, dtype=torch.promote_types(acc, weight.dtype)) if with_grad else None
    c = _chunks(n_tokens, vocab)
    for s in range(0, n_tokens, c):
        hc, yc, vc = h[s:s + c], targets[s:s + c], valid[s:s + c]
        if kernel:  # the logits in the compute dtype, overwritten with their gradient
            g = hc @ w.T
            loss = loss + ce_rows(g, yc, 1 / n, ignore_index, with_grad).sum()
        else:
            y = yc.clamp(min=0)[:, None]  # ignored rows point at class 0 and are zeroed below
            z = (hc @ w.T).to(acc)
            lse = torch.logsumexp(z, dim=-1)
            loss = loss + ((lse - z.gather(1, y).squeeze(1)) * vc).sum()
            if with_grad:
                g = torch.exp(z - lse[:, None]).scatter_add_(1, y, torch.full_like(lse[:, None], -1.0))
                g = (g * (vc[:, None] / n)).to(h.dtype)
        if with_grad:
            gh[s:s + c] = g @ w
            gw += g.T @ hc
    return loss / n, gh, gw


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, ignore_index, kernel=False):
        loss, gh, gw = _loss_and_grad(h, weight, targets, ignore_index, with_grad=True, kernel=kernel)
        ctx.save_for_backward(gh, gw)
        ctx.weight_dtype = weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        gh, gw = ctx.saved_tensors
        return gh * grad_loss.to(gh.dtype), (gw * grad_loss).to(ctx.weight_dtype), None, None, None
