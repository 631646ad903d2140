"""Small pieces that mixers and schemes share: the causal short convolution, the gated output norm, the low-rank
and scalar gates, L2 normalisation and the dtype rule for gates (`up`)."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from duality.kernels.cp import from_previous
from duality.kernels.varlen import document_positions
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from .context import TRAINING, Context


def residual_linear(d_in: int, d_out: int) -> nn.Linear:
    """A projection that writes into the residual stream: the trunk gives it the scaled init std/sqrt(2 n_layer)."""
    lin = nn.Linear(d_in, d_out, bias=False)
    lin.is_residual = True
    return lin


def split_linear(x, linear: nn.Linear, sizes) -> list:
    """linear(x) in parts of `sizes` output features, each part its own matmul and buffer. A mixer keeps all its
    projections of x in one Linear (one parameter) and groups them by what backward keeps: autograd keeps a saved
    view's whole buffer alive, so with one matmul the output gate that the norm-gate keeps held all of
    [q | k | v | gate] (4x the gate, every layer). Mixers also give q, k and v a part each: contiguous, so FLA's
    kernels keep them as they are instead of copying views of one buffer."""
    if not torch.is_grad_enabled():  # inference keeps nothing for backward: one matmul (a decoding step of 370m
        # GLA spent 0.4 of its 2.1 ms in the three extra launches, H200, docs/inference.md)
        return list(F.linear(x, linear.weight, linear.bias).split(sizes, -1))
    device = x.device.type
    if torch.is_autocast_enabled(device) and not torch.compiler.is_compiling():
        # cast x once: autocast casts an fp32 input for every matmul, and backward would keep each copy
        # (compiled, Inductor forms the cast once by itself)
        x = x.to(torch.get_autocast_dtype(device))
    biases = [None] * len(sizes) if linear.bias is None else linear.bias.split(sizes)
    return [F.linear(x, w, b) for w, b in zip(linear.weight.split(sizes), biases)]


class ShortConv(nn.Module):
    """Causal depthwise convolution over time (kernel size K) followed by SiLU (as in Mamba / Gated DeltaNet) or by
    nothing (activation=False). The incremental form keeps the last K - 1 inputs in ctx.state.conv[name]; packed
    documents (ctx.cu_seqlens) are convolved as if alone; a slice of a sequence split over ranks (ctx.cp_group)
    starts from the previous slice's last K - 1 inputs (those of its first token's document, when packed)."""

    def __init__(self, dim: int, kernel_size: int = 4, activation: bool = True):
        super().__init__()
        self.kernel_size, self.activation = kernel_size, activation
        self.weight = nn.Parameter(torch.randn(dim, 1, kernel_size) / kernel_size ** 0.5)

    def forward(self, x, ctx: Context = TRAINING, name: str = "conv"):
        # y_t = sum_i w_{K-1-i} x_{t-i}. On CUDA, FLA's kernel (Inductor's fusion of the shifted sums below, with the
        # L2 norm after it, took 10% of a Gated DeltaNet step; F.conv1d is a cuDNN call between two transposes);
        # elsewhere and when decoding, K shifted products summed in fp32 (the reference)
        B, T, D = x.shape
        K = self.kernel_size
        if ctx.cp_group is not None:  # a slice of a longer sequence: the previous slice's last inputs come first
            if T < K - 1:
                raise ValueError(f"a short convolution of kernel {K} needs slices of at least {K - 1} tokens, got {T}")
            full = torch.cat([from_previous(x[:, T - (K - 1):], ctx.cp_group), x], 1)
            cu = ctx.cu_seqlens
            if cu is not None:  # packed: those inputs count only inside the first token's document
                cu = torch.unique_consecutive(torch.cat([cu.new_zeros(1), (cu + K - 1).clamp(min=0)]))
            return self(full, Context(ctx.offset, cu), name)[:, K - 1:]
        cache, cu_seqlens = (None if ctx.state is None else ctx.state.conv), ctx.cu_seqlens
        if x.is_cuda and cache is None:  # FLA's Triton kernel, forward and backward, packed documents too
            from fla.modules.causal_conv1d import causal_conv1d
            return causal_conv1d(x, self.weight[:, 0], activation="silu" if self.activation else None,
                                 backend="triton", cu_seqlens=cu_seqlens)[0]
        if cache is not None and name in cache:
            full = torch.cat([cache[name], x], 1)
        else:
            full = F.pad(x, (0, 0, K - 1, 0))
        if cache is not None:
            cache[name] = full[:, -(K - 1):]
        w = up(self.weight[:, 0])  # [D, K]; w[:, K - 1 - i] multiplies x_{t - i}
        if T == 1 and cu_seqlens is None:  # a decoding step: the K inputs times the K taps, summed (three kernels
            # where the loop below launches 3 K)
            y = (up(full) * w.t()).sum(1, keepdim=True).to(x.dtype)
            return F.silu(y) if self.activation else y
        # packed documents: tap i (lag i) reaches back only inside the token's document
        pos = None if cu_seqlens is None else document_positions(cu_seqlens, T)[None, :, None]
        y = 0
        for i in range(K):
            tap = up(full[:, K - 1 - i:K - 1 - i + T]) * w[:, K - 1 - i]
            y = y + (tap if pos is None else tap * (pos >= i))
        y = y.to(x.dtype)  # as a convolution in x's dtype returns it (and what backward saves stays that size)
        return F.silu(y) if self.activation else y


class _SwiGLULinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, w):
        ctx.save_for_backward(a, b, w)
        return F.linear(F.silu(a) * b, w)

    @staticmethod
    def backward(ctx, dy):
        a, b, w = ctx.saved_tensors
        s = F.silu(a)
        h = s * b  # formed again
        dh = dy @ w
        dw = dy.reshape(-1, dy.shape[-1]).t() @ h.reshape(-1, h.shape[-1])
        return torch.ops.aten.silu_backward(dh * b, a), dh * s, dw


def _silu_mul(a, b):
    return F.silu(a) * b


def _recompute_contexts():
    return create_selective_checkpoint_contexts(lambda ctx, op, *args, **kwargs: CheckpointPolicy.MUST_RECOMPUTE)


# torch warns once per process that a checkpoint's context_fn runs under torch.compile: here it is meant
logging.getLogger("torch._higher_order_ops.wrap").addFilter(lambda r: "context_fn is passed" not in r.getMessage())


def swiglu_linear(a, b, w):
    """(silu(a) * b) W^T keeping for backward only a, b and W (as FLA's fused SwiGLU), and forming silu(a) * b
    again there: a plain SwiGLU also keeps silu(a) and the product, two more [N, hidden] tensors (at 370m / 8 x 4096,
    8 GiB eager). Under autocast, W is cast to a's dtype as F.linear would. Eager: an autograd.Function whose
    backward is autograd's own operations (the same gradients). Compiled: Inductor's partitioner decides anew what
    to keep, and kept the product for W's gradient; tagging it recompute-only (selective checkpointing's
    MUST_RECOMPUTE) makes it form the product in backward instead."""
    w = w.to(a.dtype)
    if torch.compiler.is_compiling():
        return F.linear(checkpoint(_silu_mul, a, b, use_reentrant=False, context_fn=_recompute_contexts), w)
    return _SwiGLULinear.apply(a, b, w)


MLP_IMPLS = ("inductor", "quack")  # model.mlp_impl


def quack_available() -> bool:
    """quack-kernels importable (model.mlp_impl=quack): its Hopper / Blackwell GEMMs run on CUDA only."""
    import importlib.util
    return importlib.util.find_spec("quack") is not None


# Outside Dynamo: CuTe-DSL kernels launched from autograd.Functions, which Dynamo cannot trace; a compiled block
# calls this between two graphs, as it calls FLA's kernels
@torch.compiler.disable
def quack_swiglu(x, w13, w2):
    """(silu(x W_1) * x W_3) W_2 by quack-kernels' GEMMs with the SwiGLU in their epilogues: the forward GEMM writes
    silu(a) * b as it writes a and b, and the backward's dL/dh = dy W_2 GEMM forms da and db (and silu(a) * b for
    dL/dW_2) in its epilogue, where swiglu_linear makes separate passes over [N, hidden] tensors. w13 holds W_1 then
    W_3 (quack's concatenated layout). Under autocast, inputs and weights are cast as an nn.Linear would."""
    from quack.mlp import mlp_func
    return mlp_func(x, w13, w2, activation="swiglu", concat_layout=True)


OUTPUT_NORM_EPS = 1e-6  # as FLA's layers' output norms


def _cast(y, dtype):
    """y in dtype, for a Function's output: not y.to(dtype) when that is y itself, since torch 2.11 compiles a
    Function returning such a no-op cast to zero gradients (tests/test_memory.py checks both Functions compiled)."""
    return y if y.dtype == dtype else y.to(dtype)


class _RMSNormGated(torch.autograd.Function):
    """y = o / rms(o) * w * silu(g), rms(o) = sqrt(mean_D o^2 + eps), over the last dim, computed in fp32 (at least)
    and returned in `dtype`; keeps o, g, w and 1/rms(o) for backward (g None: no gate)."""

    @staticmethod
    def forward(ctx, o, w, g, eps, dtype):
        r = torch.rsqrt(up(o).square().mean(-1, keepdim=True) + eps)
        y = up(o) * r * up(w)
        if g is not None:
            y = y * F.silu(up(g))
        ctx.save_for_backward(o, w, g, r)
        return _cast(y, dtype)

    @staticmethod
    def backward(ctx, dy):
        o, w, g, r = ctx.saved_tensors
        dy, n = up(dy), up(o) * r  # n: the normalised o, formed again
        dg = None
        if g is not None:
            dg = torch.ops.aten.silu_backward(dy * n * up(w), up(g)).to(g.dtype)
            dy = dy * F.silu(up(g))
        dw = (dy * n).flatten(0, -2).sum(0).to(w.dtype)
        dn = dy * up(w)
        do = r * (dn - n * (dn * n).mean(-1, keepdim=True))
        return do.to(o.dtype), dw, dg, None, None


class GatedOutput(nn.Module):
    """y = W_o [RMSNorm_head(o) * silu(gate)] (or without the gate): the output stage of GLA / Gated DeltaNet. The
    gate's pre-activation x W_g comes from the mixer's input projection (one Linear for every projection of x).
    The norm and gate are one autograd.Function (as FLA's fused norm-gate) keeping o, the gate and 1/rms(o): the
    plain modules kept fp32 copies of o, the normalised o and silu(gate) as well (7.5 GiB of GLA's 66.8 at 370m /
    8 x 4096 eager). Its output is in W_o's dtype (autocast then casts it as for any Linear)."""

    def __init__(self, d_model: int, n_heads: int, head_v: int):
        super().__init__()
        self.n_heads, self.head_v = n_heads, head_v
        # a fixed eps: nn.RMSNorm's default (the dtype's machine epsilon) made the model depend on the dtype where
        # o is small (gated Oja at init: fp32 and float64 outputs 2% apart, 11% on a one-token document)
        self.norm = nn.RMSNorm(head_v, eps=OUTPUT_NORM_EPS)
        self.o_proj = residual_linear(n_heads * head_v, d_model)

    def forward(self, o, gate=None):
        B, T = o.shape[:2]
        gate = None if gate is None else gate.reshape(o.shape)
        if o.is_cuda and gate is not None and not torch.compiler.is_compiling():
            # eager on CUDA: FLA's fused norm-gate kernel, which keeps the same; the Function is some ten
            # element-wise kernels each way when not compiled (56 ms of GLA's 370m step). Compiled, Inductor fuses it
            from fla.modules.norm.fused_norm_gate import rms_norm_gated
            o = rms_norm_gated(o, gate, self.norm.weight, None, eps=OUTPUT_NORM_EPS)
        else:
            o = _RMSNormGated.apply(o, self.norm.weight, gate, OUTPUT_NORM_EPS, self.o_proj.weight.dtype)
        return self.o_proj(o.reshape(B, T, self.n_heads * self.head_v))


class LowRankGate(nn.Linear):
    """A per-channel log forget gate from a low-rank projection (GLA; gated Oja on the value side):
    log alpha_t = logsigmoid(x_t W_1 W_2 + b) / tau, [B, T, H, D]. x W_1 comes from the mixer's input projection;
    this module is W_2 and b."""

    def __init__(self, rank: int, n_heads: int, head_dim: int, normalizer: float):
        super().__init__(rank, n_heads * head_dim, bias=True)
        self.n_heads, self.head_dim, self.normalizer = n_heads, head_dim, normalizer

    def forward(self, g_low):
        B, T, _ = g_low.shape
        return (F.logsigmoid(up(super().forward(g_low))) / self.normalizer).view(B, T, self.n_heads, self.head_dim)


def up(x):
    """At least fp32 (gates and decays are summed over many tokens), float64 stays float64."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class _L2Norm(torch.autograd.Function):
    """y = x r, r = (|x|^2 + eps)^(-1/2) over the last dim in fp32 (at least); dx = r (dy - y (y . dy)). Keeps y and
    r, not x: x is often a view of a larger buffer (q and k of DeltaNet's convolution output, whose v the kernel
    copies), which keeping x would keep alive whole; y is what the next op keeps anyway."""

    @staticmethod
    def forward(ctx, x, eps):
        r = torch.rsqrt(up(x).square().sum(-1, keepdim=True) + eps)
        y = _cast(up(x) * r, x.dtype)
        ctx.save_for_backward(y, r)
        return y

    @staticmethod
    def backward(ctx, dy):
        y, r = ctx.saved_tensors
        yf, dyf = up(y), up(dy)
        return (r * (dyf - yf * (yf * dyf).sum(-1, keepdim=True))).to(dy.dtype), None


def l2norm(x, eps: float = 1e-6):
    """x / sqrt(|x|^2 + eps) over the last dim (DeltaNet's q and k, Selective RoPE's angle source)."""
    return _L2Norm.apply(x, eps)


class ScalarDecay(nn.Module):
    """Mamba2's scalar selective decay per head, in log space: log a_t = -exp(A_log) softplus(a_t + dt_bias), with
    a_t = x_t W_a from the mixer's input projection. Init as Mamba2: A ~ U[1, 16], dt = softplus(dt_bias) ~
    logU[1e-3, 1e-1]."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.A_log = nn.Parameter(torch.zeros(n_heads))
        self.dt_bias = nn.Parameter(torch.zeros(n_heads))

    def init_extra(self):
        import math
        with torch.no_grad():
            H = self.A_log.numel()
            self.A_log.copy_(torch.log(torch.empty(H).uniform_(1, 16)))
            dt = torch.exp(torch.empty(H).uniform_(math.log(1e-3), math.log(1e-1)))
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def forward(self, a):
        return -torch.exp(up(self.A_log)) * F.softplus(up(a) + self.dt_bias)
