"""Every backbone x every positional scheme it accepts: shapes, causality, parallel == incremental, gradients."""

import copy
import itertools

import pytest
import torch

from duality.model import Cache, ConfigError, build_model, valid_schemes
from duality.model.mixers import REGISTRY as MIXERS
from duality.model.pe import REGISTRY as SCHEMES

V, T = 61, 24
SIZE = {"name": "t", "n_layer": 2, "d_model": 32, "n_heads": 4, "seq_len": T, "tie_embeddings": False}
COMBOS = [(b, p) for b in sorted(MIXERS) for p in valid_schemes(b)]


def make(backbone, pe, seed=0, **size):
    torch.manual_seed(seed)
    m = build_model({"name": backbone}, {"name": pe}, {**SIZE, **size}, V).double()
    # zero-initialised parameters (T5 table, XL's u and v) would hide their code paths: randomise everything
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m.eval()


@pytest.mark.parametrize("backbone,pe", COMBOS)
def test_forward_shape_and_loss(backbone, pe):
    m = make(backbone, pe)
    idx = torch.randint(0, V, (3, T))
    logits, loss = m(idx, idx)
    assert logits.shape == (3, T, V)
    assert torch.isfinite(loss) and abs(loss.item() - torch.log(torch.tensor(float(V)))) < 1.5


@pytest.mark.parametrize("backbone,pe", COMBOS)
def test_causal(backbone, pe):
    m = make(backbone, pe)
    idx = torch.randint(0, V, (2, T))
    t = T // 2
    other = idx.clone()
    other[:, t + 1:] = torch.randint(0, V, (2, T - t - 1))
    a, _ = m(idx)
    b, _ = m(other)
    assert torch.equal(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])  # the later positions do see the change


@pytest.mark.parametrize("backbone,pe", COMBOS)
def test_parallel_equals_incremental(backbone, pe):
    """Prefill 9 tokens in one call, then one token per call through the cache: same logits as one parallel pass."""
    m = make(backbone, pe)
    idx = torch.randint(0, V, (2, T))
    full, _ = m(idx)
    cache = Cache(SIZE["n_layer"])
    parts = [m(idx[:, :9], cache=cache)[0]] + [m(idx[:, i:i + 1], cache=cache)[0] for i in range(9, T)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-10, atol=1e-10)
    assert cache.offset == T


@pytest.mark.parametrize("backbone,pe", COMBOS)
def test_gradients_reach_every_parameter(backbone, pe):
    m = make(backbone, pe).train()
    idx = torch.randint(0, V, (2, T))
    m(idx, idx)[1].backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"{name} gets no gradient"


def test_generate_greedy_equals_repeated_full_forward():
    m = make("transformer", "rope")
    prompt = torch.randint(0, V, (1, 5))
    out = m.generate(prompt, 10, temperature=0)
    seq = prompt
    for _ in range(10):
        seq = torch.cat([seq, m(seq)[0][:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)


def test_every_invalid_combination_is_rejected_with_choices():
    for b, p in itertools.product(sorted(MIXERS), sorted(SCHEMES)):
        if p in valid_schemes(b):
            continue
        with pytest.raises(ConfigError, match=f"valid pe for backbone={b}"):
            build_model({"name": b}, {"name": p}, SIZE, V)
    assert "alibi" not in valid_schemes("linear_attn") and "rope" in valid_schemes("linear_attn")


@pytest.mark.parametrize("backbone,pe,size,match", [
    ("transformer", "rope", {"n_heads": 5}, "does not divide"),
    ("transformer", "rope", {"d_model": 36, "n_heads": 4}, "must be even"),
    ("gla_typo", "rope", {}, "unknown backbone"),
    ("transformer", "ropee", {}, "unknown positional scheme"),
    ("transformer", "rope", {"n_layers": 3}, "unknown option"),
])
def test_bad_shapes_and_names(backbone, pe, size, match):
    with pytest.raises(ConfigError, match=match):
        build_model({"name": backbone}, {"name": pe}, {**SIZE, **size}, V)


@pytest.mark.parametrize("backbone", sorted(MIXERS))
def test_every_backbone_trains_under_bf16_autocast_on_cpu(backbone):
    """train.dtype=bf16 on a CPU: the references run under autocast (PaTH's failed there: its fp32 score table took
    bf16 einsums), with the fp32 model's loss to bf16 precision."""
    torch.manual_seed(0)
    m = build_model({"name": backbone}, {"name": "nope"}, SIZE, V)
    x = torch.randint(0, V, (2, T))
    _, plain = m(x, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = m(x, x)
    loss.backward()
    assert abs(loss.item() - plain.item()) < 5e-3, (loss.item(), plain.item())  # seen: up to 2e-4
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in m.parameters())


def test_path_w_rank_is_low_rank_full_or_refused():
    d = SIZE["d_model"]
    count = lambda rank: sum(p.numel() for p in build_model(  # noqa: E731
        {"name": "path", "w_rank": rank}, {"name": "nope"}, SIZE, V).blocks[0].mixer.w_proj.parameters())
    assert count(4) == 2 * 4 * d and count(None) == d * d
    for bad in (0, d + 1):
        with pytest.raises(ConfigError, match=f"w_rank={bad} must be in 1..d_model={d}"):
            build_model({"name": "path_fox", "w_rank": bad}, {"name": "nope"}, SIZE, V)


def test_unknown_option_names_valid_ones():
    with pytest.raises(ConfigError, match=r"valid options: \['qk_norm'\]"):
        build_model({"name": "transformer", "qk_nrom": True}, {"name": "rope"}, SIZE, V)
    with pytest.raises(ConfigError, match=r"valid options: \['base'\]"):
        build_model({"name": "transformer"}, {"name": "rope", "bsae": 1.0}, SIZE, V)


def test_learned_pe_refuses_positions_past_training_context():
    m = make("transformer", "learned")
    with pytest.raises(ValueError, match="cannot extrapolate"):
        m(torch.randint(0, V, (1, T + 1)))


def test_residual_projections_get_scaled_init():
    torch.manual_seed(0)
    m = build_model({"name": "transformer"}, {"name": "rope"},
                    {**SIZE, "d_model": 256, "n_heads": 4, "n_layer": 8}, V)
    std_resid = m.blocks[0].mixer.o_proj.weight.std().item()
    std_qkv = m.blocks[0].mixer.qkv.weight.std().item()
    assert abs(std_qkv - 0.02) < 0.001
    assert abs(std_resid - 0.02 / 4) < 0.0005  # 0.02 / sqrt(2 * 8)


@pytest.mark.parametrize("backbone,pe", COMBOS)
def test_packed_documents_equal_separate_documents(backbone, pe):
    """forward(one packed row, cu_seqlens) == each document on its own, concatenated (float64). Softmax attention
    (NoPE, RoPE, ALiBi, Selective RoPE, learned rotation), FoX and the FLA-backed recurrences take the boundaries in
    their kernels (short convolutions mask the taps that reach into the previous document); every other mixer runs
    per document."""
    m = make(backbone, pe)
    cu = torch.tensor([0, 7, 8, 21, 40])
    idx = torch.randint(0, V, (1, 40))
    packed, _ = m(idx, cu_seqlens=cu)
    alone = torch.cat([m(idx[:, s:e])[0] for s, e in zip(cu[:-1].tolist(), cu[1:].tolist())], 1)
    torch.testing.assert_close(packed, alone, rtol=1e-9, atol=1e-9)
    rotations = ("rope", "selective_rope", "learned_rotation")  # the rotation kernel restarts at each document
    native = {"transformer": ("nope", "alibi", *rotations), "fox": ("nope", *rotations), "base_conv": ("nope",),
              **dict.fromkeys(("gla", "retnet", "mamba2", "deltanet", "gated_deltanet", "linear_attn", "gated_oja"),
                                ("nope", *rotations))}.get(backbone, ())
    absolute = SCHEMES[pe].kind == "absolute"  # added to the embeddings, restarted per document by the trunk
    assert m.blocks[0].mixer.packed == (pe in native or (absolute and bool(native)))


def test_pack_documents_finds_every_document_start():
    from duality.data import pack_documents
    x = torch.tensor([[5, 9, 0, 3], [0, 1, 2, 0]])  # eot = 0 begins a document (it is the next one's BOS)
    px, py, cu = pack_documents(x, x + 1, eot=0)
    assert px.tolist() == [[5, 9, 0, 3, 0, 1, 2, 0]] and py.tolist() == [[6, 10, 1, 4, 1, 2, 3, 1]]
    assert cu.tolist() == [0, 2, 4, 7, 8]


def test_short_conv_is_a_causal_depthwise_convolution():
    """ShortConv's shifted sums == F.conv1d over the left-padded sequence (float64, with SiLU and without); fed in
    pieces through its cache it gives the same; packed, each document is convolved as if alone."""
    import torch.nn.functional as F

    from duality.model.core import Context, LayerState
    from duality.model.core.layers import ShortConv
    torch.manual_seed(0)
    x = torch.randn(2, 11, 6, dtype=torch.float64)
    for act in (True, False):
        conv = ShortConv(6, 4, activation=act).double()
        want = F.conv1d(F.pad(x.transpose(1, 2), (3, 0)), conv.weight, groups=6).transpose(1, 2)
        want = F.silu(want) if act else want
        torch.testing.assert_close(conv(x), want, rtol=1e-12, atol=1e-12)
        ctx = Context(state=LayerState())
        pieces = [conv(x[:, a:b], ctx) for a, b in ((0, 2), (2, 3), (3, 11))]
        torch.testing.assert_close(torch.cat(pieces, 1), want, rtol=1e-12, atol=1e-12)
        cu = torch.tensor([0, 2, 7, 11])
        packed = conv(x[:1], Context(cu_seqlens=cu))
        alone = torch.cat([conv(x[:1, a:b]) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())], 1)
        torch.testing.assert_close(packed, alone, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backbone", sorted(MIXERS))
def test_float32_model_equals_float64_model(backbone):
    """A model's function must not depend on its dtype beyond rounding: nn.RMSNorm's default eps is the dtype's machine
    epsilon, and on gated Oja's small outputs at init that made float32 and float64 logits 2% apart (11% for a
    one-token input) until the output norms got a fixed eps."""
    torch.manual_seed(0)
    m = build_model({"name": backbone}, {"name": valid_schemes(backbone)[0]},
                    {"name": "t", "n_layer": 2, "d_model": 256, "n_heads": 4, "seq_len": 16}, V)
    m64 = copy.deepcopy(m).double()
    for idx in (torch.randint(0, V, (2, 16)), torch.randint(0, V, (2, 1))):
        with torch.no_grad():
            a, b = m(idx)[0], m64(idx)[0]
        assert ((a.double() - b).norm() / b.norm()).item() < 1e-5, backbone


@pytest.fixture
def scaled_rope():
    """A positional scheme written here, in the test, touching no mixer: RoPE with positions divided by `scale`
    (position interpolation), phi_t = (t / scale) theta. It subclasses nothing but the scheme interface."""
    from duality.kernels.rotary import rope_frequencies, rotate
    from duality.model.pe.base import PositionalScheme, register

    @register("scaled_rope_test")
    class ScaledRoPE(PositionalScheme):
        kind = "rotary"

        def __init__(self, dims, *, scale: float = 1.0, base: float = 10000.0):
            super().__init__(dims)
            self.scale, self.theta = scale, rope_frequencies(self.rotary_dim(), base)

        def rotate(self, q, k, x=None, ctx=None):
            T = q.shape[1]
            pos = ctx.positions(T)
            pos = torch.arange(ctx.offset, ctx.offset + T) if pos is None else pos
            phi = (pos.double()[:, None] / self.scale * self.theta)[:, None, :].to(q.dtype)
            return rotate(q, phi), rotate(k, phi)

    yield ScaledRoPE
    del SCHEMES["scaled_rope_test"]


@pytest.mark.parametrize("backbone", [b for b in sorted(MIXERS) if "rotary" in MIXERS[b].pe_kinds])
def test_a_new_scheme_needs_no_mixer_change(scaled_rope, backbone):
    """The seam's promise: a scheme defined outside model/ works in every mixer that takes rotary schemes, through
    the same calls as the built-in ones. scale=1 is RoPE exactly; scale=2 changes the model; decoding through the
    cache equals the parallel form; packed documents equal documents alone (mixers whose kernels pack get them)."""
    assert "scaled_rope_test" in valid_schemes(backbone)
    m1 = make(backbone, "scaled_rope_test")
    torch.testing.assert_close(m1(torch.arange(T)[None] % V)[0], make(backbone, "rope")(torch.arange(T)[None] % V)[0],
                               rtol=1e-9, atol=1e-9)
    torch.manual_seed(0)
    m2 = build_model({"name": backbone}, {"name": "scaled_rope_test", "scale": 2.0}, SIZE, V).double().eval()
    m2.load_state_dict(m1.state_dict())  # the same weights: only the positions differ
    idx = torch.randint(0, V, (2, T))
    full, _ = m2(idx)
    assert not torch.allclose(full, m1(idx)[0])
    cache = Cache(SIZE["n_layer"])
    parts = [m2(idx[:, :9], cache=cache)[0]] + [m2(idx[:, i:i + 1], cache=cache)[0] for i in range(9, T)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-10, atol=1e-10)
    cu = torch.tensor([0, 7, 8, 21, 24])
    alone = torch.cat([m2(idx[:1, s:e])[0] for s, e in zip(cu[:-1].tolist(), cu[1:].tolist())], 1)
    torch.testing.assert_close(m2(idx[:1], cu_seqlens=cu)[0], alone, rtol=1e-9, atol=1e-9)
    assert m2.blocks[0].mixer.packed == MIXERS[backbone].packable


def test_base_conv_is_zoologys_gated_convolution():
    """BaseConv(x) == (causal depthwise conv_3(x) + c) * (x W + b) + x, written with F.conv1d (float64)."""
    import torch.nn.functional as F

    from duality.model.mixers.base_conv import BaseConv
    torch.manual_seed(1)
    m = BaseConv(6, 1).double()
    with torch.no_grad():
        m.conv_bias.normal_()
        m.proj.bias.normal_()
    x = torch.randn(3, 9, 6, dtype=torch.float64)
    conv = F.conv1d(F.pad(x.transpose(1, 2), (2, 0)), m.conv.weight, groups=6).transpose(1, 2)
    want = (conv + m.conv_bias) * (x @ m.proj.weight.T + m.proj.bias) + x
    torch.testing.assert_close(m(x), want, rtol=1e-12, atol=1e-12)


def test_layer_mixers_build_zoologys_hybrid():
    """model.layer_mixers=[base_conv, backbone] over 4 layers: BaseConv, GLA (with the scheme), BaseConv, GLA;
    LayerNorm everywhere with norm=layer; embedding dropout only while training; bad entries named with choices."""
    from duality.model.mixers.base_conv import BaseConv
    from duality.model.mixers.gla import GLA
    size = {**SIZE, "n_layer": 4, "layer_mixers": ["base_conv", "backbone"], "norm": "layer", "embed_dropout": 0.5}
    m = build_model({"name": "gla"}, {"name": "rope"}, size, V)
    kinds = [type(b.mixer) for b in m.blocks]
    assert kinds == [BaseConv, GLA, BaseConv, GLA]
    assert [b.mixer.pe is None for b in m.blocks] == [True, False, True, False]
    assert all(isinstance(n, torch.nn.LayerNorm) for b in m.blocks for n in (b.norm1, b.norm2))
    assert isinstance(m.norm, torch.nn.LayerNorm)
    x = torch.randint(0, V, (2, T))
    m.eval()
    torch.testing.assert_close(m(x)[0], m(x)[0])
    m.train()
    assert not torch.allclose(m(x)[0], m(x)[0])  # dropout draws differ
    for bad, match in (({"layer_mixers": ["base_conv", "mlp"]}, r"\['mlp'\] not valid.*'base_conv'"),
                       ({"layer_mixers": []}, "empty"), ({"norm": "batch"}, r"valid choices: \['layer', 'rms'\]"),
                       ({"embed_dropout": 1.0}, r"\[0, 1\)"),
                       ({"fused_loss_impl": "liger"}, r"valid choices: \['auto', 'triton', 'chunked'\]")):
        with pytest.raises(ConfigError, match=match):
            build_model({"name": "gla"}, {"name": "rope"}, {**SIZE, **bad}, V)


def test_conv_init_std_draws_every_short_convolution_from_it():
    """model.conv_init_std: null keeps the short convolutions' unit-gain init (sd 1/sqrt(K)); 0.02 draws every one
    (the mixer's and Selective RoPE's) N(0, 0.02), as seed 004's code initialises its Conv1d layers."""
    from duality.model.core.layers import ShortConv
    size = {**SIZE, "d_model": 256, "n_heads": 4}
    backbone = {"name": "gla", "short_conv": True}
    for std, want in ((None, 0.5), (0.02, 0.02)):
        torch.manual_seed(0)
        m = build_model(backbone, {"name": "selective_rope"}, {**size, "conv_init_std": std}, V)
        convs = [c for c in m.modules() if isinstance(c, ShortConv)]
        assert len(convs) == 2 * size["n_layer"]  # q/k/v's and the angle's, in each layer
        for c in convs:
            assert c.weight.mean().abs() < 0.1 * want and abs(c.weight.std().item() / want - 1) < 0.1
    for bad in (-0.02, 0, "x"):
        with pytest.raises(ConfigError, match="conv_init_std"):
            build_model(backbone, {"name": "selective_rope"}, {**SIZE, "conv_init_std": bad}, V)
