"""VO-RoPE (seed 001, eq. 2): rotate each value v_j by R(phi_j) and the attention output back by R(phi_t)^T,

    o_t = R_t^T sum_j p_tj R_j v_j = sum_j p_tj R(phi_j - phi_t) v_j,     phi_t = t theta (as RoPE)

so the relative position acts on what is read, not on which key is read: the softmax-side view of a value-side
transition such as the gated Oja rule's. Scores stay position free (q.k alone)."""

from .base import register
from .rope import RoPE


@register("vo_rope")
class VORoPE(RoPE):
    kind = "vo_rotary"
