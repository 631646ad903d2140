"""Selective RoPE (seed 004): rotary angles that depend on the input.

Per head h, with q_t the mixer's query (L2-normalised first when the mixer is softmax attention, `normalize_q`):

    u_t      = W_h q_t                        W_h: [D/2, D] per head (weight norm: W = g V / ||V||_row)
    dphi_t   = conv(u)_t (+ b)                causal depthwise convolution over time, kernel `conv_size`, no activation
    dphi_t  *= sigmoid(w_h . x_t/||x_t|| + c_h)        optional phase gate from the block input x
    phi_t    = Theta * sum_{s <= t} dphi_s    Theta: per-channel temperatures
    q_t, k_t = rot(q_t, phi_t), rot(k_t, phi_t)        GPT-NeoX half-split pairs (kernels/rotary.py)

so <q_t, k_s> sees R(phi_t - phi_s): the rotation accumulated between s and t, a unitary and now selective
transition (the linear-attention dual is S_t = S_{t-1} exp(i Theta dphi_t) + v_t k_t^H, seed 004 eq. 12-13).
Constant increments dphi = 1 give RoPE back. Temperatures (appendix A.3.1), eps = 1 / base:
    rope:  Theta_i = eps^(2i/D)                                 (RoPE's frequencies, base 500000 by default)
    tan:   Theta_i = tan(phi_i / 2), phi = linspace(0, (1 - eps) pi, D/2)   (largest ~ 2 base / pi: pick a small base)
each times `temp_max`, and learnable when `learn_temperature`.

The bias b is a learnable constant increment per head and channel (zero at init): a learned RoPE frequency added to
the selective part. The decoding cache holds the convolution's last inputs and the raw running angle Phi_t.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kernels.rotary import rope_frequencies

from ..mixers.layers import ShortConv, l2norm
from .base import AccumulatedRotation, ConfigError, register

TEMPERATURES = ("rope", "tan")


def temperatures(schedule: str, dim: int, base: float, temp_max: float = 1.0) -> torch.Tensor:
    """Theta [dim/2] for the `rope` or `tan` schedule (seed 004, appendix A.3.1)."""
    if schedule == "rope":
        theta = rope_frequencies(dim, base)
    elif schedule == "tan":
        phi = torch.linspace(0.0, (1.0 - 1.0 / base) * math.pi, dim // 2, dtype=torch.float64)
        theta = torch.tan(phi / 2)
    else:
        raise ConfigError(f"pe=selective_rope: temperature={schedule!r}; valid choices: {list(TEMPERATURES)}")
    return (temp_max * theta).float()


@register("selective_rope")
class SelectiveRoPE(AccumulatedRotation):

    def __init__(self, dims, *, conv_size: int = 4, phase_gate: bool = False, bias: bool = False,
                 weight_norm: bool = False, temperature: str = "rope", base: float = 500000.0,
                 temp_max: float = 1.0, learn_temperature: bool = False, normalize_q: bool | None = None):
        super().__init__(dims)
        if temperature not in TEMPERATURES:
            raise ConfigError(f"pe=selective_rope: temperature={temperature!r}; valid choices: {list(TEMPERATURES)}")
        if not (isinstance(conv_size, int) and conv_size >= 1):
            raise ConfigError(f"pe=selective_rope: conv_size must be a positive integer, got {conv_size!r}")
        # base 1 with the rope schedule: every channel at temperature 1 (the paper's state-tracking setting); the tan
        # schedule's angles span (0, (1 - 1/base) pi), which base 1 collapses to zero
        if not (base > 1 or (base == 1 and temperature == "rope")):
            raise ConfigError(f"pe=selective_rope: base must be >= 1 with temperature=rope and > 1 with tan "
                              f"(eps = 1/base), got base={base} with temperature={temperature}")
        self.opts = dict(conv_size=conv_size, phase_gate=phase_gate, bias=bias, weight_norm=weight_norm,
                         temperature=temperature, base=base, temp_max=temp_max,
                         learn_temperature=learn_temperature, normalize_q=normalize_q)

    def bind(self, mixer) -> None:
        o, H, D = self.opts, mixer.n_heads, mixer.qk_head_dim
        if D % 2:
            raise ConfigError(f"pe=selective_rope rotates channel pairs: the q/k head size {D} must be even")
        self.n_heads, self.half = H, D // 2
        self.normalize_q = mixer.softmax if o["normalize_q"] is None else bool(o["normalize_q"])
        # per-head projection q_h -> u_h (random init of unit gain: it is not a residual-stream linear)
        self.weight = nn.Parameter(torch.randn(H, D // 2, D) / math.sqrt(D))
        self.gain = nn.Parameter(self.weight.detach().norm(dim=-1).clone()) if o["weight_norm"] else None
        self.conv = ShortConv(H * (D // 2), o["conv_size"], activation=False)
        self.bias = nn.Parameter(torch.zeros(H, D // 2)) if o["bias"] else None
        self.gate = nn.Linear(mixer.d_model, H, bias=True) if o["phase_gate"] else None
        theta = temperatures(o["temperature"], D, o["base"], o["temp_max"])
        if o["learn_temperature"]:
            self.theta = nn.Parameter(theta)
        else:
            self.register_buffer("theta", theta, persistent=True)

    def increments(self, q, x, cache=None):
        """dphi [B, T, H, D/2] before the temperature."""
        B, T, H, D = q.shape
        w = self.weight
        if self.gain is not None:
            w = self.gain[..., None] * w / w.norm(dim=-1, keepdim=True)
        src = l2norm(q) if self.normalize_q else q
        u = torch.einsum("bthd,hed->bthe", src, w.to(src.dtype))
        u = self.conv(u.reshape(B, T, H * self.half), cache, "conv").view(B, T, H, self.half)
        if self.bias is not None:
            u = u + self.bias.to(u.dtype)
        if self.gate is not None:
            if x is None:
                raise ValueError("pe=selective_rope with phase_gate needs the block input x")
            u = u * torch.sigmoid(self.gate(F.normalize(x, dim=-1)))[..., None].to(u.dtype)
        return u

