"""VO-RoPE (seed 001, eq. 2): rotate each value v_j by R(phi_j) and the attention output back by R(phi_t)^T,

    o_t = R_t^T sum_j p_tj R_j v_j = sum_j p_tj R(phi_j - phi_t) v_j,     phi_t = t theta (as RoPE)

so the relative position acts on what is read, not on which key is read: the softmax-side view of a value-side
transition such as the gated Oja rule's. Scores stay position free (q.k alone)."""

from duality.kernels.rotary import rotate

from ..core.context import TRAINING
from .base import PositionalScheme, register
from .rope import RoPE


@register("vo_rope")
class VORoPE(RoPE):
    kind = "vo_rotary"
    packable = False
    rotate = PositionalScheme.rotate  # q and k stay as they are

    def rotate_values(self, v, ctx=TRAINING):
        return rotate(v, self.angles(v.shape[1], ctx.offset, v.shape[-1], v.device))

    def rotate_output(self, o, ctx=TRAINING):
        return rotate(o, -self.angles(o.shape[1], ctx.offset, o.shape[-1], o.device))
