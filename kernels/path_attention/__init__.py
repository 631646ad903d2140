"""PaTH attention: softmax attention whose position encoding is an accumulated product of Householder-like
transforms H_s = I - beta_s w_s w_s^T (the dual of DeltaNet's transition, seed 000 section 5):

    score_ij = scale * k_j^T (H_{j+1} H_{j+2} ... H_i) q_i  +  (c_i - c_j)          j <= i
    o_i      = sum_j softmax_j(score_ij) v_j

with the optional FoX log-decay c (PaTH-FoX, the dual of Gated DeltaNet). H_s is symmetric, so the same product
moves keys forward: the decoding cache stores k~_j = H_t ... H_{j+1} k_j and updates it by H_t at each new token.

`path_attention_reference` computes all scores in T sweeps (sweep d applies H_{i-d+1} to every query at once and
reads the score of key i-d), O(T^2 D) work in O(T D) memory per sweep. `path_attention` dispatches (impl=None:
FLA's `parallel_path_attn` on CUDA, the reference elsewhere; "fla" or "torch" to choose). FLA scales its gate term
by the attention scale; we keep the gate unscaled (as FoX and ALiBi), so we hand FLA g / scale.

    reference.py   the T-sweep reference        fla.py   FLA's kernel
"""

from __future__ import annotations

import math

from .. import use_fla
from ..attention import cumulative_log_decay
from . import fla
from .reference import householder, path_attention_reference, path_scores

__all__ = ["householder", "path_attention", "path_attention_reference", "path_scores"]


def path_attention(q, k, v, w, beta, log_gate=None, scale=None, impl: str | None = None):
    """log_gate: per-token log forget gate [B, T, H] (its cumulative sum is the FoX log-decay), or None."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if use_fla("path_attention", q, impl):
        return fla.path_attention(q, k, v, w, beta, log_gate, scale)
    c = None if log_gate is None else cumulative_log_decay(log_gate)
    return path_attention_reference(q, k, v, w, beta, c, scale)
