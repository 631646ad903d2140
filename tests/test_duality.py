"""The primitives against the formulas, and each duality as an equality of two independent code paths (float64)."""

import math

import pytest
import torch
from conftest import qkv

from duality.kernels.attention import decayed_attention, decayed_attention_reference
from duality.kernels.rotary import cumulative_angles, rope_frequencies, rotate
from duality.model.core import Context, Dims
from duality.model.pe.alibi import ALiBi, alibi_slopes
from duality.model.pe.rope import RoPE
from duality.model.pe.sinusoidal import sinusoid_table
from duality.model.pe.t5 import T5Bias, t5_bucket
from duality.model.pe.xl import TransformerXL


@pytest.fixture(autouse=True)
def float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)




def test_rotate_is_complex_multiplication():
    x, phi = torch.randn(4, 5, 8), torch.randn(4, 5, 4)
    z = torch.complex(x[..., :4], x[..., 4:]) * torch.exp(1j * phi)
    torch.testing.assert_close(rotate(x, phi), torch.cat([z.real, z.imag], -1))


def test_rope_is_cumulative_rotation_with_constant_increments():
    rope = RoPE(Dims(32, 4, 8, 64))
    q, k = torch.randn(2, 20, 4, 8), torch.randn(2, 20, 4, 8)
    theta = rope_frequencies(8).to(torch.float32)
    phi = cumulative_angles(theta.expand(20, 4).unsqueeze(0), dim=1) - theta  # sum over s = 1..t of theta = t theta
    rq, rk = rope.rotate(q, k)
    torch.testing.assert_close(rq, rotate(q, phi[:, :, None, :]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rk, rotate(k, phi[:, :, None, :]), rtol=1e-5, atol=1e-5)


def test_rope_frequencies_are_built_once_a_device():
    """An eager forward asks for theta in every layer: built once per (size, device), not copied to the GPU each time
    (such a copy breaks CUDA-graph capture: evals/harness.py's GraphedTrunk), and equal to the formula."""
    rope = RoPE(Dims(32, 4, 8, 64), base=500.0)
    a, b = rope.frequencies(8, torch.device("cpu")), rope.frequencies(8, "cpu")
    assert a is b and a.dtype == torch.float64
    torch.testing.assert_close(a, 500.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8), rtol=0, atol=0)
    assert rope.frequencies(4, "cpu") is not a and rope.frequencies(4, "cpu").shape == (2,)
    assert rope.frequencies(8) is not a  # no device: a new tensor on the default device (meta when sizing a model)


def test_rope_scores_depend_only_on_distance():
    rope = RoPE(Dims(8, 1, 8, 64))
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    s = [(rope.rotate(q, k, ctx=Context(o))[0] * rope.rotate(q, k, ctx=Context(o + 3))[1]).sum() for o in (0, 7, 40)]
    torch.testing.assert_close(torch.stack(s), s[0].expand(3), rtol=1e-5, atol=1e-5)


def test_alibi_equals_explicit_linear_bias():
    """ALiBi's slopes, and the cumulative log-decay c_t = -m_h t, == softmax(q.k/sqrt(d) - m_h |i - j|) written out
    (seed 002)."""
    H, T = 4, 11
    q, k, v = qkv(T=T, H=H)
    score = ALiBi(Dims(32, H, 8, 64)).scores(q, k)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    m = torch.tensor([2 ** (-8 * h / H) for h in range(1, H + 1)])
    bias = -(m[:, None, None] * (i - j).abs()).unsqueeze(0)
    want = decayed_attention_reference(q, k, v, bias=bias)
    torch.testing.assert_close(decayed_attention(q, k, v, slopes=score["slopes"].double()), want)
    torch.testing.assert_close(decayed_attention(q, k, v, log_decay=-(m * torch.arange(T)[:, None])[None]), want)
    assert alibi_slopes(8)[0] == 0.5 and alibi_slopes(8)[-1] == 2 ** -8


def test_linear_attention_with_rope_is_complex_gated_recurrence():
    """Seed 000 section 4: RoPE on q, k of linear attention == S_t = S_{t-1} e^{i Omega} + v_t k~_t^H,
    o_t = Re(S_t q~_t), with q~ = q1 + i q2 and k~ = k1 + i k2 (here with the conjugate on the query side,
    matching the rotation direction R(phi_t) q)."""
    B, T, H, D = 2, 9, 1, 8
    q, k, v = qkv(B, T, H, D)
    rope = RoPE(Dims(8, 1, D, 64))
    rq, rk = rope.rotate(q.float(), k.float())
    o_rope, _ = gated_recurrent(rq.double(), rk.double(), v, torch.zeros(B, T, H, 1, dtype=torch.float64), 1.0)
    omega = rope_frequencies(D).to(torch.complex128)
    qc, kc = torch.complex(q[..., :4], q[..., 4:]), torch.complex(k[..., :4], k[..., 4:])
    S = torch.zeros(B, H, D, D // 2, dtype=torch.complex128)
    outs = []
    for t in range(T):
        S = S * torch.exp(-1j * omega) + torch.einsum("bhe,bhd->bhed", v[:, t].to(torch.complex128), kc[:, t])
        outs.append(torch.einsum("bhed,bhd->bhe", S, qc[:, t].conj()).real)
    torch.testing.assert_close(o_rope, torch.stack(outs, 1), rtol=1e-5, atol=1e-5)


def test_sinusoid_table_formula():
    tab = sinusoid_table(torch.arange(7), 6, 10000.0)
    pos, i = 5, 1
    assert tab[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 6)), rel=1e-6)
    assert tab[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / 6)), rel=1e-6)


def test_t5_buckets():
    n = torch.arange(0, 400)
    b = t5_bucket(n, 32, 128)
    assert torch.equal(b[:16], torch.arange(16))  # exact below num_buckets / 2
    assert (b[1:] >= b[:-1]).all() and b.max() == 31 and b[128:].eq(31).all()
    expected = 16 + int(math.log(40 / 16) / math.log(128 / 16) * 16)
    assert b[40].item() == expected


def test_t5_bias_lookup():
    pe = T5Bias(Dims(16, 2, 8, 64))
    torch.nn.init.normal_(pe.table)
    q, k = torch.randn(1, 3, 2, 8), torch.randn(1, 10, 2, 8)
    bias = pe.scores(q, k)["bias"]
    for n, i in enumerate(range(7, 10)):
        for j in range(10):
            expect = pe.table[t5_bucket(torch.tensor(max(i - j, 0)), 32, 128), 1]
            assert bias[0, 1, n, j] == expect


def test_xl_bias_matches_the_four_term_formula():
    H, D, d_model, Tk, Tq = 2, 4, 8, 7, 3
    pe = TransformerXL(Dims(d_model, H, D, 64)).double()
    torch.nn.init.normal_(pe.u)
    torch.nn.init.normal_(pe.v)
    q, k = torch.randn(1, Tq, H, D), torch.randn(1, Tk, H, D)
    bias = pe.scores(q, k)["bias"]
    W = pe.W_R.weight.view(H, D, d_model)
    for n, i in enumerate(range(Tk - Tq, Tk)):
        for j in range(i + 1):
            r = sinusoid_table(torch.tensor([i - j]), d_model).double()[0]
            for h in range(H):
                R = W[h] @ r
                term = (q[0, n, h] @ R + pe.u[h] @ k[0, j, h] + pe.v[h] @ R) / math.sqrt(D)
                torch.testing.assert_close(bias[0, h, n, j], term)


# ------------------------------------------------------------------------------ the recurrences and their duals
from duality.kernels.path_attention import path_scores  # noqa: E402
from duality.kernels.recurrences import (  # noqa: E402
    delta_rule_recurrent,
    gated_chunked,
    gated_recurrent,
    oja_recurrent,
)
from duality.model import build_model  # noqa: E402
from duality.model.mixers.scalar_decay import retnet_gammas  # noqa: E402


def _decay_mask_attention(q, k, v, log_a):
    """The parallel (matrix) form of a scalar-decay linear recurrence: O = ((Q K^T) * D) V,
    D_ij = prod a = e^{c_i - c_j}."""
    c = torch.cumsum(log_a, 1).transpose(1, 2)  # [B, H, T]
    T = q.shape[1]
    D = torch.exp(c[..., :, None] - c[..., None, :]).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), 0)
    return torch.einsum("bhij,bjhd->bihd", torch.einsum("bihd,bjhd->bhij", q, k) * D, v)


def test_retnet_is_linear_attention_with_the_alibi_mask():
    """RetNet's fixed decay gamma_h == linear attention with the decay mask gamma^(i-j): ALiBi without softmax."""
    q, k, v = qkv(T=21, H=4)
    log_gamma = torch.log(retnet_gammas(4))
    o, _ = gated_chunked(q, k, v, log_gamma.expand(2, 21, 4)[..., None], 1.0)
    torch.testing.assert_close(o, _decay_mask_attention(q, k, v, log_gamma.expand(2, 21, 4)))


def test_mamba2_decay_is_linear_attention_with_the_fox_mask():
    q, k, v = qkv(T=21)
    log_a = torch.nn.functional.logsigmoid(torch.randn(2, 21, 3))
    o, _ = gated_recurrent(q, k, v, log_a[..., None], 1.0)
    torch.testing.assert_close(o, _decay_mask_attention(q, k, v, log_a))


def test_alibi_transformer_equals_fox_with_a_constant_gate():
    """Seed 000 sections 2-3 at model level: a FoX layer whose forget gate is the constant sigmoid(b_h) = e^{-m_h}
    computes exactly what softmax attention + ALiBi computes, given the same q, k, v, o weights."""
    size = {"name": "t", "n_layer": 2, "d_model": 32, "n_heads": 4, "seq_len": 20}
    torch.manual_seed(0)
    alibi = build_model({"name": "transformer"}, {"name": "alibi"}, size, 50).double()
    fox = build_model({"name": "fox"}, {"name": "nope"}, size, 50).double()
    missing = fox.load_state_dict(alibi.state_dict(), strict=False).missing_keys
    assert sorted(missing) == [f"blocks.{i}.mixer.f_proj.{p}" for i in range(2) for p in ("bias", "weight")]
    m = alibi_slopes(4).double()
    for block in fox.blocks:
        torch.nn.init.zeros_(block.mixer.f_proj.weight)
        with torch.no_grad():  # logsigmoid(b) = -m  <=>  b = -log(e^m - 1)
            block.mixer.f_proj.bias.copy_(-torch.log(torch.expm1(m)))
    idx = torch.randint(0, 50, (2, 20))
    torch.testing.assert_close(fox(idx)[0], alibi(idx)[0])


@pytest.mark.parametrize("gated", [False, True])
def test_deltanet_is_path_without_softmax(gated):
    """Seed 000 sections 5-6: the delta rule's output is sum_j beta_j (k_j^T H_{j+1}..H_t q_t) v_j (times
    e^{c_t - c_j} for Gated DeltaNet), i.e. PaTH (PaTH-FoX) scores with w = k, without the softmax."""
    q, k, v = qkv(T=17)
    k = torch.nn.functional.normalize(k, dim=-1)
    beta = torch.rand(2, 17, 3)
    g = torch.nn.functional.logsigmoid(torch.randn(2, 17, 3)) if gated else None
    o, _ = delta_rule_recurrent(q, k, v, beta, 1.0, g)
    A = path_scores(q, k, k, beta) * beta.transpose(1, 2)[:, :, None, :]
    if gated:
        c = torch.cumsum(g, 1).transpose(1, 2)
        A = A * torch.exp(c[..., :, None] - c[..., None, :]).tril()
    torch.testing.assert_close(o, torch.einsum("bhij,bjhd->bihd", A, v))


def test_gated_oja_equals_its_value_side_unrolling():
    """Seed 001 eq. 4: o_t = sum_j [prod_{s=j+1..t} (I - beta_s v_s v_s^T) diag(alpha_s)] beta_j v_j (k_j^T q_t),
    with the first factor (s = t) leftmost; our recurrence includes diag(alpha_j)... order checked explicitly."""
    B, T, H, D = 1, 6, 1, 4
    q, k, v = qkv(B, T, H, D)
    v = torch.nn.functional.normalize(v, dim=-1)
    gv = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D))
    beta = torch.rand(B, T, H)
    o, _ = oja_recurrent(q, k, v, gv, beta, 1.0)
    eye = torch.eye(D)
    for t in range(T):
        acc = torch.zeros(D)
        for j in range(t + 1):
            P = eye.clone()
            for s in range(t, j, -1):  # (I - b_t v_t v_t^T) D_t ... (I - b_{j+1} ...) D_{j+1}
                P = P @ (eye - beta[0, s, 0] * torch.outer(v[0, s, 0], v[0, s, 0])) @ torch.diag(torch.exp(gv[0, s, 0]))
            acc = acc + beta[0, j, 0] * (P @ v[0, j, 0]) * (k[0, j, 0] @ q[0, t, 0])
        torch.testing.assert_close(o[0, t, 0], acc)


def test_vo_rope_rotates_values_by_relative_angle():
    size = {"name": "t", "n_layer": 1, "d_model": 8, "n_heads": 1, "seq_len": 12}
    m = build_model({"name": "transformer"}, {"name": "vo_rope"}, size, 20).double()
    mixer = m.blocks[0].mixer
    x = torch.randn(1, 12, 8)
    q, k, v = mixer.qkv(x).view(1, 12, 3, 1, 8).unbind(2)
    p = torch.softmax((torch.einsum("bihd,bjhd->bij", q, k) / math.sqrt(8)).masked_fill(
        torch.ones(12, 12, dtype=torch.bool).triu(1), float("-inf")), -1)
    theta = rope_frequencies(8)
    ref = torch.zeros(1, 12, 8)
    for t in range(12):
        for j in range(t + 1):
            ref[0, t] += p[0, t, j] * rotate(v[0, j, 0], (j - t) * theta)
    torch.testing.assert_close(mixer(x), mixer.o_proj(ref), rtol=1e-5, atol=1e-6)
