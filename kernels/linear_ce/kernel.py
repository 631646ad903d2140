"""The cross-entropy of one chunk of logits in one Triton kernel, its gradient written over the logits (in place).

For a row z [V] with target y (ignored when y == ignore_index) and the chunk's scale c = 1 / n:

    lse    = log sum_v exp(z_v)                   pass 1: a running max and sum over blocks of V (online softmax)
    loss   = lse - z_y                            (0 when ignored)
    z_v   <- c (exp(z_v - lse) - [v == y])        pass 2: the gradient dL/dz, stored in z's own dtype

What it replaces (chunked.py under torch.compile) cast the chunk's bf16 logits to fp32, formed exp(z - lse) as a new
fp32 tensor, scattered the -1 into it and cast the product back to bf16: passes over fp32 copies of a [tokens,
vocab] chunk. Here the logits are read twice and written once, in their own dtype, with no second buffer; the
matmuls around it (z = h W^T before, dL/dh = g W and dL/dW = g^T h after) are cuBLAS's.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: the chunked PyTorch path serves
    triton = None

BLOCK_V = 4096  # columns a program (one row) holds at once: 16 per thread over 8 warps


if triton is not None:
    @triton.jit
    def _ce_rows_kernel(z_ptr, y_ptr, loss_ptr, scale_ptr, V, stride_z, ignore_index,
                        BLOCK: tl.constexpr, ACC: tl.constexpr, WITH_GRAD: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        z_row = z_ptr + row * stride_z
        y = tl.load(y_ptr + row)
        cols = tl.arange(0, BLOCK)
        m = tl.full([BLOCK], float("-inf"), ACC)  # per lane: running max and sum of exp(z - max)
        s = tl.zeros([BLOCK], ACC)
        for start in range(0, V, BLOCK):
            z = tl.load(z_row + start + cols, mask=start + cols < V, other=float("-inf")).to(ACC)
            # a lane that has seen only -inf (past V) keeps s = 0: shifting by 0 there avoids exp(-inf - -inf)
            m_new = tl.maximum(m, z)
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            s = s * tl.exp(m - shift) + tl.exp(z - shift)
            m = m_new
        m_row = tl.max(m, 0)
        log_s = tl.log(tl.sum(s * tl.exp(m - m_row), 0))  # lse = m_row + log_s, kept apart: at |z| ~ 1e4 their
        valid = y != ignore_index                           # fp32 sum would lose the digits of log_s
        z_y = tl.load(z_row + tl.where(valid, y, 0)).to(ACC)
        tl.store(loss_ptr + row, tl.where(valid, (m_row - z_y) + log_s, 0.0))
        if WITH_GRAD:
            c = tl.where(valid, tl.load(scale_ptr).to(ACC), 0.0)
            for start in range(0, V, BLOCK):
                idx = start + cols
                z = tl.load(z_row + idx, mask=idx < V, other=float("-inf")).to(ACC)  # exp: 0 past V
                g = c * (tl.exp((z - m_row) - log_s) - tl.where(idx == y, 1.0, 0.0))
                tl.store(z_row + idx, g.to(z_ptr.dtype.element_ty), mask=idx < V)


def ce_rows(z, targets, scale, ignore_index: int = -1, with_grad: bool = True):
    """Per-row losses [N] (in fp32, or float64 for float64 logits) of logits z [N, V]; with_grad: z is overwritten
    with scale * (softmax(z) - onehot(targets)), zero on ignored rows. scale: a one-element tensor (1 / the number
    of scored tokens, kept on the device: no host sync)."""
    n, vocab = z.shape
    if z.stride(1) != 1 or targets.shape != (n,):
        raise ValueError(f"ce_rows: logits [N, V] with unit column stride and targets [N]; got strides "
                         f"{z.stride()} and targets {tuple(targets.shape)}")
    acc = torch.float64 if z.dtype == torch.float64 else torch.float32
    loss = torch.empty(n, device=z.device, dtype=acc)
    if n:
        _ce_rows_kernel[(n,)](z, targets, loss, scale, vocab, z.stride(0), ignore_index,
                              BLOCK=min(BLOCK_V, triton.next_power_of_2(vocab)),
                              ACC=tl.float64 if acc == torch.float64 else tl.float32, WITH_GRAD=with_grad,
                              num_warps=8)
    return loss
