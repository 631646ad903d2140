"""Symmetric power transformers (seed 003): the feature map, the recurrent form against the attention form, the
gated / p = 4 / recurrent variants through the model's cache, the learned rotation, the named architectures."""

import math

import pytest
import torch

from duality.kernels.attention import decayed_attention_reference
from duality.kernels.rotary import rope_frequencies, rotate
from duality.model import Cache, ConfigError, build_model
from duality.model.mixers.sympow import sympow_features, sympow_recurrent

V, T = 61, 24
SIZE = {"name": "t", "n_layer": 2, "d_model": 32, "n_heads": 4, "seq_len": T}


def test_feature_map_inner_product_is_the_squared_dot():
    x, y = torch.randn(5, 7, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64)
    fx, fy = sympow_features(x), sympow_features(y)
    assert fx.shape == (5, 7 * 8 // 2)
    torch.testing.assert_close((fx * fy).sum(-1), (x * y).sum(-1) ** 2, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gated", [False, True])
def test_recurrent_form_equals_attention_form(gated):
    """Proposition 2: S_i = gamma_i S_{i-1} + v_i phi(k_i)^T, Z_i likewise, y_i = S_i phi(q_i) / Z_i phi(q_i) ==
    sum_j b_ij (q_i.k_j)^2 v_j / sum_j b_ij (q_i.k_j)^2, run one token at a time and in uneven chunks."""
    torch.manual_seed(0)
    B, H, d = 2, 3, 6
    q, k, v = (torch.randn(B, T, H, d, dtype=torch.float64) for _ in range(3))
    f = torch.nn.functional.logsigmoid(torch.randn(B, T, H, dtype=torch.float64) + 1) if gated else None
    want = decayed_attention_reference(q, k, v, log_decay=None if f is None else torch.cumsum(f, 1), power=2)
    for bounds in (list(range(T + 1)), [0, 5, 6, 13, T]):
        state, outs = None, []
        for a, b in zip(bounds[:-1], bounds[1:]):
            o, state = sympow_recurrent(q[:, a:b], k[:, a:b], v[:, a:b], None if f is None else f[:, a:b], state)
            outs.append(o)
        torch.testing.assert_close(torch.cat(outs, 1), want, rtol=1e-10, atol=1e-10)
    S, Z = state
    assert S.shape == (B, H, d, d * (d + 1) // 2) and Z.shape == (B, H, d * (d + 1) // 2)


def _model(backbone, pe, seed=0):
    torch.manual_seed(seed)
    m = build_model(backbone, {"name": pe}, SIZE, V).double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m.eval()


@pytest.mark.parametrize("options,pe", [({"power": 2, "gating": True}, "rope"),
                                        ({"power": 4, "gating": True}, "learned_rotation"),
                                        ({"power": 4}, "selective_rope"),
                                        ({"power": 2, "recurrent": True}, "nope"),
                                        ({"power": 2, "gating": True, "recurrent": True}, "learned_rotation"),
                                        ({"power": 2, "gating": True, "recurrent": True}, "selective_rope")])
def test_generation_equals_parallel(options, pe):
    """Prefill 9 tokens, then one per call, through the KV cache or the recurrent state: the parallel logits."""
    m = _model({"name": "sympow", **options}, pe)
    idx = torch.randint(0, V, (2, T))
    full, _ = m(idx)
    cache = Cache(SIZE["n_layer"])
    parts = [m(idx[:, :9], cache=cache)[0]] + [m(idx[:, i:i + 1], cache=cache)[0] for i in range(9, T)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-9, atol=1e-9)
    layer = cache.layers[0]
    assert (layer.S is not None and layer.k is None) if options.get("recurrent") else (layer.k is not None)


def test_gating_and_power_change_the_model_and_train():
    idx = torch.randint(0, V, (2, T))
    outs = {}
    for name, opts in {"p2": {"power": 2}, "p4": {"power": 4}, "p2g": {"power": 2, "gating": True}}.items():
        m = _model({"name": "sympow", **opts}, "rope").train()
        logits, loss = m(idx, idx)
        loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())
        outs[name] = logits.detach()
    assert not torch.allclose(outs["p2"], outs["p4"]) and not torch.allclose(outs["p2"], outs["p2g"])
    gate = _model({"name": "sympow", "gating": True}, "rope").blocks[0].mixer.log_gate(torch.randn(1, 3, 32).double())
    assert gate.shape == (1, 3, 4) and (gate < 0).all()


def test_learned_rotation_with_constant_rate_is_rope_with_the_papers_rates():
    """beta = 1 (W_beta = 0): rotation by t * theta, theta_i = 2 pi / N^(2i/d) (seed 003 section 2.2), N = max_len."""
    m = _model({"name": "sympow"}, "learned_rotation")
    pe = m.blocks[0].mixer.pe
    torch.nn.init.zeros_(pe.beta.weight)
    q, k, x = torch.randn(2, 10, 4, 8).double(), torch.randn(2, 10, 4, 8).double(), torch.randn(2, 10, 32).double()
    rq, rk = pe.rotate(q, k, x)
    theta = 2 * math.pi * rope_frequencies(8, SIZE["seq_len"])
    assert theta[0] == 2 * math.pi and abs(theta[-1] - 2 * math.pi / T ** 0.75) < 1e-12
    phi = torch.arange(1, 11, dtype=torch.float64)[:, None, None] * theta.float().double()  # mu_t (beta = 1), the
    # rates stored in fp32
    torch.testing.assert_close(rq, rotate(q, phi), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rk, rotate(k, phi), rtol=1e-12, atol=1e-12)
    # a non-zero W_beta makes the rate data-dependent, within (0, 2) times theta
    torch.nn.init.normal_(pe.beta.weight)
    beta = pe.increments(q, x)
    assert beta.shape == (2, 10, 4, 1) and ((beta > 0) & (beta < 2)).all() and beta.std() > 0.1


def test_bad_options_are_named():
    with pytest.raises(ConfigError, match="power must be an even integer"):
        build_model({"name": "sympow", "power": 3}, {"name": "rope"}, SIZE, V)
    with pytest.raises(ConfigError, match="recurrent=true needs power=2"):
        build_model({"name": "sympow", "power": 4, "recurrent": True}, {"name": "rope"}, SIZE, V)
    with pytest.raises(ConfigError, match="pe=alibi is a score scheme"):
        build_model({"name": "sympow"}, {"name": "alibi"}, SIZE, V)
    with pytest.raises(ConfigError, match="max_len must be an integer"):
        build_model({"name": "sympow"}, {"name": "learned_rotation", "max_len": 1}, SIZE, V)
