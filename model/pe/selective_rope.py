"""Selective RoPE (seed 004): rotary angles that depend on the input.

Per head h, from a source vector a_t,h (`source`):
    x:  the block input x_t split into H chunks, each L2-normalised (the seed's released code, every experiment)
    q:  the mixer's query, L2-normalised first when the mixer is softmax attention (`normalize_q`; Figure 9's listing)

    u_t      = W a_t                          rank r: W = W_up W_down over all heads' sources (d_in H -> r -> H D/2)
                                              rank null: one [D/2, d_in] matrix per head (weight norm: W = g V/||V||)
    dphi_t   = conv(u)_t                      causal depthwise convolution over time, kernel `conv_size`
               (skip_conv: u_t - u_{t-1}, so the angle below is u_t itself and does not accumulate)
    dphi_t  += e^b                            optional bias b per head and channel, 0 at init: +1 per token
    dphi_t  *= sigmoid(w_h . x_t/||x_t|| + c_h)        optional phase gate from the block input x
    phi_t    = Theta * sum_{s <= t} dphi_s    Theta: per-channel temperatures
    q_t, k_t = rot(q_t, phi_t), rot(k_t, phi_t)        GPT-NeoX half-split pairs (kernels/rotary/)

so <q_t, k_s> sees R(phi_t - phi_s): the rotation accumulated between s and t, a unitary and now selective
transition (the linear-attention dual is S_t = S_{t-1} exp(i Theta dphi_t) + v_t k_t^H, seed 004 eq. 12-13).
Constant increments dphi = 1 give RoPE back (a zero W with the bias at init). Temperatures (appendix A.3.1),
eps = 1 / base, the largest one scaled to `temp_max` (as the seed's code does; null: the formula as printed):
    rope:  Theta_i = eps^(2i/D)                                 (RoPE's frequencies; base 1: every channel 1)
    tan:   Theta_i = tan(phi_i / 2), phi = linspace(0, (1 - eps) pi, D/2)
learnable when `learn_temperature`. The low-rank projection is two nn.Linear layers, so the trunk gives them its
N(0, 0.02) init (as the seed's Hugging Face models do): at init the angles barely depend on the input.

The decoding cache holds the convolution's last inputs (or u_{t-1} with skip_conv) and the raw running angle Phi_t.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from duality.kernels.cp import from_previous
from duality.kernels.rotary import rope_frequencies

from ..core.context import TRAINING
from ..core.layers import ShortConv, l2norm
from .base import AccumulatedRotation, ConfigError, register

TEMPERATURES = ("rope", "tan")


def temperatures(schedule: str, dim: int, base: float, temp_max: float | None = 1.0) -> torch.Tensor:
    """Theta [dim/2] for the `rope` or `tan` schedule (seed 004, appendix A.3.1), the largest scaled to temp_max."""
    if schedule == "rope":
        theta = rope_frequencies(dim, base)
    elif schedule == "tan":
        phi = torch.linspace(0.0, (1.0 - 1.0 / base) * math.pi, dim // 2, dtype=torch.float64)
        theta = torch.tan(phi / 2)
    else:
        raise ConfigError(f"pe=selective_rope: temperature={schedule!r}; valid choices: {list(TEMPERATURES)}")
    if temp_max is not None:
        theta = temp_max * theta / theta.max()
    return theta.float()


SOURCES = ("x", "q")


@register("selective_rope")
class SelectiveRoPE(AccumulatedRotation):

    # defaults: Figure 9's form (source q, a full projection per head), which checkpoints written before `source`
    # and `rank` existed used; conf/pe/selective_rope.yaml sets the seed's released code's (x, rank 32)
    def __init__(self, dims, *, source: str = "q", rank: int | None = None, conv_size: int = 4,
                 skip_conv: bool = False, phase_gate: bool = False, bias: bool = False, weight_norm: bool = False,
                 temperature: str = "rope", base: float = 500000.0, temp_max: float | None = 1.0,
                 learn_temperature: bool = False, normalize_q: bool | None = None):
        super().__init__(dims)
        if temperature not in TEMPERATURES:
            raise ConfigError(f"pe=selective_rope: temperature={temperature!r}; valid choices: {list(TEMPERATURES)}")
        if source not in SOURCES:
            raise ConfigError(f"pe=selective_rope: source={source!r}; valid choices: {list(SOURCES)}")
        if rank is not None and not (isinstance(rank, int) and not isinstance(rank, bool) and rank >= 1):
            raise ConfigError(f"pe=selective_rope: rank must be a positive integer or null, got {rank!r}")
        if weight_norm and rank is not None:
            raise ConfigError("pe=selective_rope: weight_norm applies to the per-head projection (rank=null)")
        if not (isinstance(conv_size, int) and conv_size >= 1):
            raise ConfigError(f"pe=selective_rope: conv_size must be a positive integer, got {conv_size!r}")
        if temp_max is not None and not temp_max > 0:
            raise ConfigError(f"pe=selective_rope: temp_max must be > 0 or null, got {temp_max!r}")
        # base 1 with the rope schedule: every channel at temperature 1 (the paper's state-tracking setting); the tan
        # schedule's angles span (0, (1 - 1/base) pi), which base 1 collapses to zero
        if not (base > 1 or (base == 1 and temperature == "rope")):
            raise ConfigError(f"pe=selective_rope: base must be >= 1 with temperature=rope and > 1 with tan "
                              f"(eps = 1/base), got base={base} with temperature={temperature}")
        H, D = dims.n_heads, self.rotary_dim()
        self.n_heads, self.half, self.source = H, D // 2, source
        self.d_in = D if source == "q" else dims.d_model // H
        self.normalize_q = dims.softmax if normalize_q is None else bool(normalize_q)
        if rank is None:  # per head: a_h -> u_h (random init of unit gain: not a residual-stream linear)
            self.weight = nn.Parameter(torch.randn(H, D // 2, self.d_in) / math.sqrt(self.d_in))
            self.gain = nn.Parameter(self.weight.detach().norm(dim=-1).clone()) if weight_norm else None
        else:  # across heads through a bottleneck; nn.Linear: the trunk's N(0, 0.02) init
            self.down = nn.Linear(H * self.d_in, rank, bias=False)
            self.up = nn.Linear(rank, H * (D // 2), bias=False)
        self.skip_conv = skip_conv
        self.conv = None if skip_conv else ShortConv(H * (D // 2), conv_size, activation=False)
        # the increment's bias is e^b (b = 0: +1 per token, RoPE's step), as the seed's code adds it
        self.log_bias = nn.Parameter(torch.zeros(H, D // 2)) if bias else None
        self.gate = nn.Linear(dims.d_model, H, bias=True) if phase_gate else None
        theta = temperatures(temperature, D, base, temp_max)
        if learn_temperature:
            self.theta = nn.Parameter(theta)
        else:
            self.register_buffer("theta", theta, persistent=True)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if prefix + "bias" in state_dict:  # written before the bias became e^b (2026-11-24)
            raise ConfigError(f"{prefix}bias: this checkpoint's Selective RoPE bias was added as is; it is now e^b "
                              "(as the seed's code), so the checkpoint cannot be loaded: retrain with pe.bias=true")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def increments(self, q, x, ctx=TRAINING):
        """dphi [B, T, H, D/2] before the temperature."""
        B, T, H, _ = q.shape
        if self.source == "q":
            src = l2norm(q) if self.normalize_q else q
        else:
            if x is None:
                raise ValueError("pe=selective_rope with source=x needs the block input x")
            src = l2norm(x.view(B, T, H, self.d_in))
        if hasattr(self, "up"):
            u = self.up(self.down(src.reshape(B, T, H * self.d_in)))
        else:
            w = self.weight
            if self.gain is not None:
                w = self.gain[..., None] * w / w.norm(dim=-1, keepdim=True)
            u = torch.einsum("bthd,hed->bthe", src, w.to(src.dtype)).reshape(B, T, H * self.half)
        state = ctx.state
        if self.skip_conv:  # u_t - u_{t-1}: the cumulative sum below gives u_t back
            prev = None if state is None else state.u
            if ctx.cp_group is not None:  # the previous slice's last u
                prev = from_previous(u[:, -1:], ctx.cp_group)
            prev = torch.zeros_like(u[:, :1]) if prev is None else prev
            if state is not None:
                state.u = u[:, -1:]
            before = torch.cat([prev, u[:, :-1]], 1)
            pos = ctx.positions(T)
            if pos is not None:  # packed: a document's first token has no u before it
                before = before * (pos > 0)[None, :, None].to(u.dtype)
            u = u - before
        else:
            u = self.conv(u, ctx, "pe")
        u = u.view(B, T, H, self.half)
        if self.log_bias is not None:
            u = u + self.log_bias.exp().to(u.dtype)
        if self.gate is not None:
            if x is None:
                raise ValueError("pe=selective_rope with phase_gate needs the block input x")
            u = u * torch.sigmoid(self.gate(F.normalize(x, dim=-1)))[..., None].to(u.dtype)
        return u
