"""The value gradient of GLA's chunked backward, its intra-chunk product on tensor cores at fp32 accuracy.

FLA's chunked GLA splits the sequence into chunks of C tokens. With G the chunk-local cumulative log2 gate
(G_t = sum of g_s / ln 2 over the chunk's tokens s <= t), its forward keeps the intra-chunk scores
A[t, i] = scale * sum_k q_t,k k_i,k 2^(G_t,k - G_i,k) for i <= t (fp32), and its backward the gradient dh_c [K, V]
of the state at the end of chunk c. The value gradient of token i of chunk c is then

    dv_i = sum_{t >= i, t in c} A[t, i] do_t  +  (k_i * 2^(G_last - G_i)) dh_c          (G_last: the chunk's last row)

FLA 0.6.0 computes the first term as an fp32 dot with tf32 disallowed, which Triton runs on CUDA cores: 0.49 ms of
the 2.0 ms a 370m layer's GLA takes forward and backward on an H200 (8 x 4,096 tokens, 16 heads of 32 / 64). Here it
is three tf32 passes on tensor cores (Triton's input_precision "tf32x3", about fp32's error): 0.20 ms; the second term
stays a bf16 product as FLA has it. `reference.gla_bwd_dv_reference` is the formula in PyTorch.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _gla_bwd_dv_kernel(k, g, A, do, dh, dv, cu_seqlens, chunk_indices, T, H: tl.constexpr, K: tl.constexpr,
                       V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                       IS_VARLEN: tl.constexpr, LOW: tl.constexpr):
    i_v, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if IS_VARLEN:  # chunk i_c of the flattened batch is chunk i_t of document i_n (B = 1)
        i_h = i_bh
        i_n = tl.load(chunk_indices + i_c * 2).to(tl.int64)
        i_t = tl.load(chunk_indices + i_c * 2 + 1).to(tl.int64)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        T = (tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos).to(tl.int32)
        i_state = i_c
    else:
        i_b, i_h = i_bh // H, i_bh % H
        i_t = i_c
        bos = i_b.to(tl.int64) * T
        i_state = i_b * tl.cdiv(T, BT) + i_t
    o_t = i_t * BT + tl.arange(0, BT)  # the chunk's rows, within the document
    o_i = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    o_k = tl.arange(0, BK)
    m_t, m_v, m_k = o_t < T, o_v < V, o_k < K
    rows = (bos + o_t) * H + i_h  # row of token t of head h in the [tokens, H, width] tensors

    # sum_{t >= i} A[t, i] do_t = tril(A)^T do
    b_A = tl.load(A + rows[:, None] * BT + o_i[None, :], mask=m_t[:, None], other=0.0)
    b_A = tl.where(o_i[None, :] <= o_i[:, None], b_A, 0.0)
    b_do = tl.load(do + rows[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
    b_dv = tl.dot(tl.trans(b_A), b_do.to(tl.float32), input_precision="tf32x3")

    # + (k_i 2^(G_last - G_i)) dh_c, a bf16 product
    last = (bos + tl.minimum(i_t * BT + BT, T) - 1) * H + i_h
    m_tk = m_t[:, None] & m_k[None, :]
    b_k = tl.load(k + rows[:, None] * K + o_k[None, :], mask=m_tk, other=0.0)
    b_g = tl.load(g + rows[:, None] * K + o_k[None, :], mask=m_tk, other=0.0)
    b_gl = tl.load(g + last * K + o_k, mask=m_k, other=0.0)
    b_kg = (b_k * tl.exp2(b_gl[None, :] - b_g)).to(tl.bfloat16)
    p_dh = dh + (i_state.to(tl.int64) * H + i_h) * K * V
    b_dh = tl.load(p_dh + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
    b_dh = b_dh.to(tl.bfloat16)
    # Triton's interpreter (CPU) multiplies bf16 wrongly: there the bf16-rounded values are multiplied in fp32
    b_dv = tl.dot(b_kg.to(LOW), b_dh.to(LOW), b_dv)
    tl.store(dv + rows[:, None] * V + o_v[None, :], b_dv.to(dv.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])


def gla_bwd_dv(k, g, A, do, dh, cu_seqlens=None, chunk_size: int = 64, chunk_indices=None):
    """dv [B, T, H, V] (do's dtype) from k [B, T, H, K], g [B, T, H, K] (the chunk-local cumulative log2 gate, fp32),
    A [B, T, H, C] (fp32), do [B, T, H, V] and dh [B, NT, H, K, V] (NT chunks a sequence; packed documents: B = 1,
    cu_seqlens [N + 1] and chunk_indices [NT, 2], the (document, chunk) of each chunk, dh [1, NT, H, K, V])."""
    B, T, H, K = k.shape
    V = do.shape[-1]
    BV = min(triton.next_power_of_2(V), 64)
    if cu_seqlens is not None and chunk_indices is None:
        raise ValueError("gla_bwd_dv: packed documents (cu_seqlens) need chunk_indices")
    NT = triton.cdiv(T, chunk_size) if cu_seqlens is None else len(chunk_indices)
    dv = torch.empty_like(do)
    grid = (triton.cdiv(V, BV), NT, B * H if cu_seqlens is None else H)
    low = tl.float32 if os.environ.get("TRITON_INTERPRET") == "1" else tl.bfloat16
    _gla_bwd_dv_kernel[grid](k, g, A, do, dh, dv, cu_seqlens, chunk_indices, T, H=H, K=K, V=V, BT=chunk_size,
                             BK=max(16, triton.next_power_of_2(K)), BV=BV, IS_VARLEN=cu_seqlens is not None,
                             LOW=low, num_warps=4)
    return dv
