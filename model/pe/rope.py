"""RoPE (Su et al.): rotate q and k by angles phi_t = t * theta, theta_i = base^(-2i/d_head).

A cumulative rotation with constant increments dphi_s = 1 and temperatures theta (kernels/rotary/); the dual of
the complex forget gate A_t = exp(i Omega) of a linear recurrence (seed 000, section 4).
"""

import torch

from duality.kernels.rotary import cumulative_rotation, rope_frequencies, rotate, rotate_cos_sin

from ..core.context import TRAINING
from .base import PositionalScheme, register


@register("rope")
class RoPE(PositionalScheme):
    context_parallel = True  # positions from ctx.offset
    kind = "rotary"

    def __init__(self, dims, *, base: float = 10000.0):
        super().__init__(dims)
        self.base = base
        self._theta = {}  # (dim, device) -> theta there (frequencies)
        # cos and sin of phi_t for the training context, in float64 (exact for float64 models; cast per use), not
        # saved in checkpoints. Positions past it (length extrapolation) are computed on the fly.
        phi = self.angles(dims.max_seq_len, 0, self.rotary_dim(), None, dtype=torch.float64)  # [T, 1, dim/2]
        self.register_buffer("cos", torch.cos(phi), persistent=False)
        self.register_buffer("sin", torch.sin(phi), persistent=False)

    def frequencies(self, dim: int, device=None) -> torch.Tensor:
        """theta [dim/2]. The rotated dimension is the mixer's q/k head size, which need not be d_model / n_heads
        (GLA halves it)."""
        if dim % 2:
            raise ValueError(f"pe={self.name} rotates channel pairs: the q/k head size {dim} must be even")
        if device is None or torch.compiler.is_compiling():  # float64, on the default device (meta when sizing)
            theta = rope_frequencies(dim, self.base)
            return theta if device is None else theta.to(device)
        # kept per device: an eager forward would otherwise build theta on the CPU and copy it to the GPU in every
        # layer, a copy that a CUDA graph cannot capture (evals/harness.py's GraphedTrunk)
        key = (dim, torch.device(device))
        if key not in self._theta:
            self._theta[key] = rope_frequencies(dim, self.base).to(device)
        return self._theta[key]

    def angles(self, T: int, offset: int, dim: int, device, positions=None, dtype=torch.float32) -> torch.Tensor:
        """phi [T, 1, dim/2] for positions offset .. offset+T-1, or the given positions [T] (broadcasts over batch
        and heads). device None: the default device."""
        pos = offset + torch.arange(T, device=device) if positions is None else positions  # offset: int or 0-d
        return (pos.to(dtype)[:, None] * self.frequencies(dim, device).to(dtype)[None, :])[:, None, :]

    def rotate(self, q, k, x=None, ctx=TRAINING):
        # The cumulative sum of constant increments has the closed form t * theta; cumulative_rotation(q, k, None,
        # theta, phi0=offset - 1) computes the same (tests/kernels/test_rotary.py). Eager on CUDA it is the faster
        # path: one Triton launch for q and k, where the table's element-wise chain is ~10 unfused kernels each way
        # (28 ms of an eager 124m step); compiled, Inductor fuses the table path into the projections around it.
        T, offset, positions = q.shape[1], ctx.offset, ctx.positions(q.shape[1])
        if q.is_cuda and positions is None and q.dtype != torch.float64 and not torch.compiler.is_compiling():
            return cumulative_rotation(q, k, None, self.frequencies(q.shape[-1], q.device).float(), offset - 1)[:2]
        table = getattr(self, "cos", None)
        if (positions is None and table is not None and table.dtype == torch.float64 and not ctx.static
                and offset + T <= len(table)):
            cos, sin = self.cos[offset:offset + T], self.sin[offset:offset + T]
            return rotate_cos_sin(q, cos, sin), rotate_cos_sin(k, cos, sin)
        phi = self.angles(T, offset, q.shape[-1], q.device, positions, torch.promote_types(q.dtype, torch.float32))
        return rotate(q, phi), rotate(k, phi)
