"""The cumulative-rotation primitive (kernels/rotary/) and the schemes built on it: RoPE, Selective RoPE, the
learned (beta-scaled) rotation. The reference is checked against a float64 computation written differently
(complex numbers, a lower-triangular matmul for the running sum); the Triton kernel runs in Triton's interpreter on
a CPU (conftest sets TRITON_INTERPRET=1 when there is no GPU) and is checked against the reference, forward and
backward, at awkward lengths and across packed-document boundaries."""

import math
import os

import pytest
import torch
from conftest import DEV, interp

from duality.kernels.rotary import cumulative_rotation, cumulative_rotation_reference, rope_frequencies, rotate
from duality.kernels.rotary.kernel import _block_t
from duality.model import Cache, ConfigError, build_model
from duality.model.core import Context
from duality.model.pe.selective_rope import temperatures


def direct(q, k, dphi, theta, phi0=None):
    """float64, complex form: z = x1 + i x2 -> z exp(i theta Phi_t), Phi_t = phi0 + L @ dphi (L lower triangular)."""
    B, T, H, D = q.shape
    inc = torch.ones(B, T, H, D // 2, dtype=torch.float64) if dphi is None else dphi.double().expand(B, T, H, D // 2)
    L = torch.tril(torch.ones(T, T, dtype=torch.float64))
    Phi = torch.einsum("ts,bshe->bthe", L, inc) + (0 if phi0 is None else phi0.double()[:, None])
    rot = torch.exp(1j * theta.double() * Phi)

    def r(x):
        z = torch.complex(x[..., :D // 2].double(), x[..., D // 2:].double()) * rot
        return torch.cat([z.real, z.imag], -1)
    return r(q), r(k), Phi[:, -1]


def test_reference_matches_direct_float64():
    torch.manual_seed(0)
    B, T, H, D = 2, 37, 3, 10
    q, k = torch.randn(B, T, H, D, dtype=torch.float64), torch.randn(B, T, H, D, dtype=torch.float64)
    dphi, theta, phi0 = torch.randn(B, T, H, D // 2), torch.rand(H, D // 2), torch.randn(B, H, D // 2)
    want = direct(q, k, dphi, theta, phi0)
    got = cumulative_rotation_reference(q, k, dphi.double(), theta.double(), phi0.double())
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    # fp32 inputs: fp32 accumulation, within fp32 rounding of the float64 answer
    got32 = cumulative_rotation_reference(q.float(), k.float(), dphi, theta, phi0)
    torch.testing.assert_close(got32[0].double(), want[0], rtol=1e-5, atol=2e-5)


def test_reference_gradcheck():
    torch.manual_seed(1)
    B, T, H, D = 1, 6, 2, 4
    args = [torch.randn(B, T, H, D, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    args += [torch.randn(B, T, H, D // 2, dtype=torch.float64, requires_grad=True),
             torch.rand(D // 2, dtype=torch.float64, requires_grad=True)]
    assert torch.autograd.gradcheck(lambda *a: cumulative_rotation_reference(*a)[:2], args)


def test_rope_is_constant_increments():
    """The RoPE scheme (closed form t * theta) equals the primitive with constant increments dphi = 1, both in the
    reference and in the kernel (CONST mode), at positions offset .. offset + T - 1."""
    from duality.model.pe import Dims
    from duality.model.pe.rope import RoPE
    torch.manual_seed(2)
    q, k = torch.randn(2, 9, 3, 8), torch.randn(2, 9, 3, 8)
    theta = rope_frequencies(8).float()
    for offset in (0, 5):
        phi = torch.arange(offset, offset + 9).float()[:, None, None] * theta
        rq, rk = RoPE(Dims(24, 3, 8, 64)).rotate(q, k, ctx=Context(offset))
        torch.testing.assert_close(rq, rotate(q, phi))
        torch.testing.assert_close(rk, rotate(k, phi))
        triton_runs = os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()
        impls = ["torch"] + (["triton"] if triton_runs else [])
        for impl in impls:
            cq, ck, _ = cumulative_rotation(q.to(DEV), k.to(DEV), None, theta.to(DEV), phi0=offset - 1.0, impl=impl)
            torch.testing.assert_close(cq.cpu(), rq, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(ck.cpu(), rk, rtol=1e-5, atol=1e-5)


def test_rope_table_is_the_closed_form():
    """A built RoPE reads cos/sin of t * theta from its float64 table up to the training context and computes them
    past it; both equal rotate(x, t * theta) from float64 angles, values and gradients, on either side of the edge."""
    from duality.model.pe import Dims
    from duality.model.pe.rope import RoPE

    torch.manual_seed(3)
    pe = RoPE(Dims(24, 3, 8, 16)).double()
    assert pe.cos.dtype == torch.float64 and pe.cos.shape == (16, 1, 4) and "cos" not in pe.state_dict()
    theta = rope_frequencies(8)
    for offset, T in ((0, 16), (5, 11), (10, 9), (20, 3)):  # inside, at the edge, across it, past it
        q, k = (torch.randn(2, T, 3, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
        phi = torch.arange(offset, offset + T, dtype=torch.float64)[:, None, None] * theta
        rq, rk = pe.rotate(q, k, ctx=Context(offset))
        torch.testing.assert_close(rq, rotate(q, phi), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(rk, rotate(k, phi), rtol=1e-12, atol=1e-12)
        g = torch.randn_like(rq)
        got = torch.autograd.grad((rq * g).sum() + rk.sum(), (q, k))
        want = torch.autograd.grad((rotate(q, phi) * g).sum() + rotate(k, phi).sum(), (q, k))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="head size 7 must be even"):
        RoPE(Dims(21, 3, 7, 16))


CASES = [  # (B, T, H, D, increments, phi0)
    (2, 5, 2, 16, "full", False),        # shorter than one block
    (2, 77, 3, 16, "full", True),        # not a multiple of the block, continuing from a cached angle
    (1, 128, 2, 64, "full", False),      # exactly two blocks of head dim 64
    (2, 70, 2, 12, "full", False),       # D/2 = 6: not a power of two
    (2, 77, 3, 16, "broadcast", True),   # one increment per head (learned / conformal rotation)
    (2, 77, 3, 16, "const", True),       # RoPE
]


def _inputs(B, T, H, D, inc, phi0, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=g).to(DEV, dtype).requires_grad_()
    k = torch.randn(B, T, H, D, generator=g).to(DEV, dtype).requires_grad_()
    dphi = None if inc == "const" else (
        torch.randn(B, T, H, D // 2 if inc == "full" else 1, generator=g).to(DEV, dtype).requires_grad_())
    theta = torch.rand(H, D // 2, generator=g).to(DEV).requires_grad_()
    p0 = torch.randn(B, H, D // 2, generator=g).to(DEV) if phi0 else None
    return q, k, dphi, theta, p0


def _grads(outs, ins, seed=1):
    g = torch.Generator().manual_seed(seed)
    w = [torch.randn(o.shape, generator=g).to(o.device) for o in outs[:2]]
    loss = sum((o.double() * wi.double()).sum() for o, wi in zip(outs[:2], w))
    return torch.autograd.grad(loss, [i for i in ins if i is not None])


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@interp
@pytest.mark.parametrize("B,T,H,D,inc,phi0", CASES)
def test_kernel_matches_reference(B, T, H, D, inc, phi0):
    q, k, dphi, theta, p0 = _inputs(B, T, H, D, inc, phi0)
    got = cumulative_rotation(q, k, dphi, theta, phi0=p0, impl="triton")
    ins = [q, k, dphi, theta]
    d64 = [None if x is None else x.detach().double().requires_grad_() for x in ins]
    want = cumulative_rotation_reference(*d64, phi0=None if p0 is None else p0.double())
    for g, w in zip(got, want):
        assert _rel(g, w) < 1e-6
    for name, g, w in zip(["q", "k", "dphi", "theta"], _grads(got, ins), _grads(want, d64)):
        assert g.shape == w.shape, name
        assert _rel(g, w) < 1e-5, name


@interp
def test_kernel_bf16():
    q, k, dphi, theta, _ = _inputs(2, 77, 2, 16, "full", False, dtype=torch.bfloat16)
    got = cumulative_rotation(q, k, dphi, theta, impl="triton")
    assert got[0].dtype == torch.bfloat16
    ins = [q, k, dphi, theta]
    d64 = [x.detach().double().requires_grad_() for x in ins]
    want = cumulative_rotation_reference(*d64)
    assert _rel(got[0], want[0]) < 1e-2 and _rel(got[1], want[1]) < 1e-2
    for g, w in zip(_grads(got, ins), _grads(want, d64)):
        assert g.dtype == w.dtype or g.dtype in (torch.bfloat16, torch.float32)
        assert _rel(g, w) < 2e-2


@interp
def test_kernel_packed_documents_restart():
    """With cu_seqlens the running angle restarts at every document: each document rotates as if alone."""
    bt = _block_t()
    cu = torch.tensor([0, 3, bt + 1, bt + 2, 2 * bt + 9], dtype=torch.int32)  # boundaries inside and at block edges
    N = int(cu[-1])
    q, k, dphi, theta, _ = _inputs(1, N, 2, 16, "full", False)
    got = cumulative_rotation(q, k, dphi, theta, cu_seqlens=cu.to(DEV), impl="triton")
    assert got[2] is None
    ins = [q, k, dphi, theta]
    d64 = [x.detach().double().requires_grad_() for x in ins]
    want = cumulative_rotation_reference(*d64, cu_seqlens=cu)
    for g, w in zip(got[:2], want[:2]):
        assert _rel(g, w) < 1e-6
    for g, w in zip(_grads(got, ins), _grads(want, d64)):
        assert _rel(g, w) < 1e-5
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):  # independent: each document on its own
        alone = cumulative_rotation_reference(*[x[:, s:e] for x in d64[:3]], d64[3])
        assert _rel(got[0][:, s:e], alone[0]) < 1e-6


def test_bad_inputs_are_named():
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(ValueError, match=r"\[B, T, H, D/2\]"):
        cumulative_rotation(q, q, torch.randn(1, 4, 2, 3), torch.rand(4))
    with pytest.raises(ValueError, match="temperatures"):
        cumulative_rotation(q, q, None, torch.rand(3))
    with pytest.raises(ValueError, match="impl"):
        cumulative_rotation(q, q, None, torch.rand(4), impl="cuda")
    with pytest.raises(ValueError, match="float64"):
        cumulative_rotation(q.double(), q.double(), None, torch.rand(4), impl="triton")


# ------------------------------------------------------------------------------------------ Selective RoPE scheme

SIZE = {"n_layer": 2, "d_model": 32, "n_heads": 2, "seq_len": 32, "tie_embeddings": False}
ALL_FLAGS = {"phase_gate": True, "bias": True, "weight_norm": True, "learn_temperature": True}


def _model(backbone, **pe):
    """backbone: a name or a backbone config dict."""
    torch.manual_seed(0)
    backbone = backbone if isinstance(backbone, dict) else {"name": backbone}
    m = build_model(backbone, {"name": "selective_rope", **pe}, SIZE, 40).double()
    with torch.no_grad():  # zero-initialised biases would hide their paths
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m.eval()


def test_temperature_schedules():
    torch.testing.assert_close(temperatures("rope", 16, 500000.0), rope_frequencies(16, 500000.0).float())
    t = temperatures("tan", 16, 100.0, temp_max=None)  # the formula as printed (appendix A.3.1)
    assert t[0] == 0 and torch.all(t[1:] > t[:-1])
    assert abs(t[-1].item() - math.tan((1 - 1 / 100) * math.pi / 2)) < 1e-5 * t[-1].item()
    torch.testing.assert_close(temperatures("tan", 16, 100.0, temp_max=0.25), 0.25 * t / t[-1])  # the seed's code
    torch.testing.assert_close(temperatures("rope", 16, 100.0, temp_max=0.5), 0.5 * rope_frequencies(16, 100.0).float())
    with pytest.raises(ConfigError, match="valid choices"):
        build_model({"name": "gla"}, {"name": "selective_rope", "temperature": "cosine"}, SIZE, 40)
    with pytest.raises(ConfigError, match="valid options"):
        build_model({"name": "gla"}, {"name": "selective_rope", "phasegate": True}, SIZE, 40)
    with pytest.raises(ConfigError, match="head size 5 must be even"):  # GLA's key dim 32 * 0.3125 / 2 heads
        build_model({"name": "gla", "expand_k": 0.3125}, {"name": "selective_rope"}, SIZE, 40)
    # base 1 (the seed's state-tracking setting): every channel's temperature is 1; the tan schedule needs base > 1
    m = build_model({"name": "gla"}, {"name": "selective_rope", "base": 1.0}, SIZE, 40)
    assert torch.equal(m.blocks[0].mixer.pe.theta, torch.ones_like(m.blocks[0].mixer.pe.theta))
    for temp, base in (("tan", 1.0), ("rope", 0.5)):
        with pytest.raises(ConfigError, match=f"base must be >= 1 with temperature=rope and > 1 with tan.*{base}"):
            build_model({"name": "gla"}, {"name": "selective_rope", "base": base, "temperature": temp}, SIZE, 40)


def test_softmax_mixers_normalise_q():
    assert _model("transformer").blocks[0].mixer.pe.normalize_q
    assert _model("fox").blocks[0].mixer.pe.normalize_q
    assert not _model("gla").blocks[0].mixer.pe.normalize_q


def test_constant_increments_give_rope():
    """Selective RoPE with a zero projection and bias 1 is RoPE with the same base: dphi = 1, phi_t = (t + 1) theta.
    (Softmax attention sees only phi_t - phi_s; a per-channel decay such as GLA's would also see the global phase.)"""
    m = build_model({"name": "transformer"}, {"name": "selective_rope", "bias": True, "base": 10000.0}, SIZE, 40)
    r = build_model({"name": "transformer"}, {"name": "rope"}, SIZE, 40)
    m, r = m.double(), r.double()
    r.load_state_dict({k: v for k, v in m.state_dict().items() if k in r.state_dict()})
    with torch.no_grad():
        for b in m.blocks:
            b.mixer.pe.weight.zero_()
            b.mixer.pe.log_bias.zero_()  # its value at init: increments e^0 = 1
    idx = torch.randint(0, 40, (2, 20))
    torch.testing.assert_close(m(idx)[0], r(idx)[0], rtol=1e-10, atol=1e-10)


# the seed's released-code forms: angles from the block input through a low-rank projection; copying's skip_conv
VARIANTS = [({"name": "gla", "short_conv": True, "expand_k": 1.0},
             {"source": "x", "rank": 8, "bias": True, "base": 1.0}),
            ({"name": "gla"}, {"source": "x", "rank": 8, "skip_conv": True, "temperature": "tan", "base": 1e4,
                               "temp_max": 0.25, "phase_gate": True, "bias": True}),
            ({"name": "transformer"}, {"source": "x", "rank": None, "weight_norm": True, "phase_gate": True}),
            ({"name": "fox"}, {"source": "q", "rank": 6, "skip_conv": True})]


@pytest.mark.parametrize("backbone,pe", [(b, ALL_FLAGS) for b in ("gla", "transformer", "gated_deltanet", "fox")]
                         + VARIANTS)
def test_generation_path_equals_parallel(backbone, pe):
    """All flags on, and the seed's code's forms: prefill + one token per step through the cache (conv state or
    u_{t-1}, running angle) == parallel."""
    m = _model(backbone, **pe)
    idx = torch.randint(0, 40, (2, 21))
    full, _ = m(idx)
    cache = Cache(SIZE["n_layer"])
    parts = [m(idx[:, :7], cache=cache)[0]] + [m(idx[:, i:i + 1], cache=cache)[0] for i in range(7, 21)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-10, atol=1e-10)
    assert cache.layers[0].phi.shape == (2, SIZE["n_heads"], m.blocks[0].mixer.pe.dims.rotary_dim // 2)


def test_angles_depend_on_input_and_train():
    """The rotation is selective (earlier tokens move later angles) and every parameter gets a gradient."""
    m = _model("gla", **ALL_FLAGS)
    pe = m.blocks[0].mixer.pe
    q = torch.randn(1, 10, 2, m.blocks[0].mixer.pe.dims.rotary_dim, dtype=torch.float64)
    x = torch.randn(1, 10, SIZE["d_model"], dtype=torch.float64)
    a, _ = pe.rotate(q, q, x)
    q2 = q.clone()
    q2[:, 2] += 1.0
    b, _ = pe.rotate(q2, q2, x)
    assert torch.allclose(a[:, :2], b[:, :2]) and not torch.allclose(a[:, 5], b[:, 5])
    idx = torch.randint(0, 40, (2, 16))
    m.train()
    m(idx, idx)[1].backward()
    for name, p in pe.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("backbone,pe", VARIANTS)
def test_variants_causal_and_trained(backbone, pe):
    m = _model(backbone, **pe)
    idx = torch.randint(0, 40, (2, 21))
    full, _ = m(idx)
    other = idx.clone()
    other[:, 12:] = torch.randint(0, 40, (2, 9))
    assert torch.equal(m(other)[0][:, :12], full[:, :12])
    m.train()
    m(idx, idx)[1].backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_source_x_reads_the_block_input_per_head():
    """source=x: the angles move with x (each head's chunk L2-normalised: its scale does not matter), not with q."""
    m = _model("gla", source="x", rank=8)
    pe = m.blocks[0].mixer.pe
    q = torch.randn(1, 10, 2, m.blocks[0].mixer.pe.dims.rotary_dim, dtype=torch.float64)
    x = torch.randn(1, 10, SIZE["d_model"], dtype=torch.float64)
    a, _ = pe.rotate(q, q, x)
    x2 = x.clone()
    x2[:, :, :16] *= 3.0  # head 0's chunk scaled: the same after the per-head L2 norm
    torch.testing.assert_close(pe.rotate(q, q, x2)[0], a)
    x2[:, 2] += 1.0
    b, _ = pe.rotate(q, q, x2)
    assert torch.allclose(a[:, :2], b[:, :2]) and not torch.allclose(a[:, 5], b[:, 5])
    with pytest.raises(ValueError, match="source=x needs the block input"):
        pe.rotate(q, q)


def test_skip_conv_angle_is_the_projection_itself():
    """skip_conv: increments u_t - u_{t-1} sum to phi_t = Theta (u_t + t e^b): the angle does not accumulate u."""
    m = _model("gla", source="x", rank=8, skip_conv=True, bias=True)
    pe = m.blocks[0].mixer.pe
    x = torch.randn(2, 9, SIZE["d_model"], dtype=torch.float64)
    q = torch.zeros(2, 9, 2, m.blocks[0].mixer.pe.dims.rotary_dim, dtype=torch.float64)
    u = pe.up(pe.down(torch.nn.functional.normalize(x.view(2, 9, 2, 16), dim=-1).reshape(2, 9, 32))).view(2, 9, 2, -1)
    t = torch.arange(1, 10, dtype=torch.float64)[None, :, None, None]
    torch.testing.assert_close(pe.increments(q, x).cumsum(1), u + t * pe.log_bias.exp())


def test_bias_starts_at_one_radian_per_token_and_low_rank_starts_small():
    """The seed's state-tracking Selective RoPE at init: e^0 = 1 per token on every channel (base 1: temperature 1),
    and the low-rank projection (the trunk's N(0, 0.02) init) adds only a small input-dependent part."""
    torch.manual_seed(0)
    m = build_model({"name": "gla", "expand_k": 1.0},
                    {"name": "selective_rope", "source": "x", "rank": 32, "bias": True, "base": 1.0},
                    {**SIZE, "d_model": 384, "n_heads": 12}, 40)
    pe = m.blocks[0].mixer.pe
    x = torch.randn(4, 50, 384)
    dphi = pe.increments(torch.zeros(4, 50, 12, 32), x)
    assert torch.equal(pe.theta, torch.ones(16)) and torch.equal(pe.log_bias, torch.zeros(12, 16))
    assert (dphi - 1).abs().max() < 0.1 and (dphi - 1).abs().mean() > 1e-4


def test_old_additive_bias_checkpoints_are_refused():
    m = _model("gla", bias=True)
    sd = {k.replace("log_bias", "bias"): v for k, v in m.state_dict().items()}
    with pytest.raises(ConfigError, match="bias was added as is; it is now e\\^b"):
        m.load_state_dict(sd)


def test_selective_rope_equals_figure_9():
    """seed 004 Figure 9, written out from its listing on one shared random input: a per-head weight-normed
    projection of q (L2-normalised for softmax attention), a short convolution, the phase gate from the L2-normalised
    block input, the cumulative sum times the temperatures, and a rotation of *interleaved* pairs (x_2i, x_2i+1).
    This repo rotates half-split pairs (x_i, x_i+D/2): the same rotation after a fixed permutation of channels."""
    torch.manual_seed(0)
    B, T, H, D, d = 2, 13, 3, 8, 24
    q, k = torch.randn(B, T, H, D, dtype=torch.float64), torch.randn(B, T, H, D, dtype=torch.float64)
    x = torch.randn(B, T, d, dtype=torch.float64)
    V = torch.randn(H, D, D // 2, dtype=torch.float64)  # Figure 9's ChunkedLinear weight [heads, in, out]
    s = torch.rand(H, dtype=torch.float64) + 0.5  # its per-head scalar
    conv_w = torch.randn(H * D // 2, 4, dtype=torch.float64)  # depthwise, [channels, taps], taps[-1] = current
    Wg, bg = torch.randn(H, d, dtype=torch.float64), torch.randn(H, dtype=torch.float64)
    theta = temperatures("rope", D, 100.0).double()

    # --- Figure 9 (interleaved pairs), from its equations
    perm = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])  # interleaved -> half-split order
    qi, ki = q[..., perm.argsort()], k[..., perm.argsort()]  # the same vectors, stored interleaved
    qn = qi / qi.norm(dim=-1, keepdim=True)
    W = s[:, None, None] * V / V.norm(dim=-2, keepdim=True)
    phi = torch.einsum("bthi,hio->btho", qn, W).reshape(B, T, -1)
    pad = torch.cat([torch.zeros(B, 3, H * D // 2, dtype=torch.float64), phi], 1)
    phi = sum(pad[:, 3 - j:3 - j + T] * conv_w[:, 3 - j] for j in range(4)).view(B, T, H, D // 2)
    xn = x / x.norm(dim=-1, keepdim=True)
    phi = phi * torch.sigmoid(xn @ Wg.T + bg)[..., None]
    ang = theta * phi.cumsum(1)
    def rot(v):  # noqa: E306
        a, b = v[..., 0::2], v[..., 1::2]
        return torch.stack([a * ang.cos() - b * ang.sin(), b * ang.cos() + a * ang.sin()], -1).flatten(-2)
    want_q, want_k = rot(qi), rot(ki)

    # --- this repo's module with the same weights
    m = build_model({"name": "transformer"}, {"name": "selective_rope", "source": "q", "rank": None,
                                              "weight_norm": True, "phase_gate": True, "base": 100.0},
                    {**SIZE, "d_model": d, "n_heads": H}, 40).double()
    pe = m.blocks[0].mixer.pe
    assert pe.normalize_q and pe.weight.shape == (H, D // 2, D)
    with torch.no_grad():
        pe.weight.copy_(V.transpose(1, 2)[..., perm])  # [out, in], its input channels in half-split order
        pe.gain.copy_(s[:, None].expand(H, D // 2))
        pe.conv.weight.copy_(conv_w[:, None])
        pe.gate.weight.copy_(Wg)
        pe.gate.bias.copy_(bg)
    got_q, got_k = pe.rotate(q, k, x)
    # tolerance: l2norm's eps (1e-6 under the square root) against the exact norm above
    torch.testing.assert_close(got_q, want_q[..., perm], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_k, want_k[..., perm], rtol=1e-6, atol=1e-6)
    assert (got_q - q).abs().max() > 0.1  # it did rotate
