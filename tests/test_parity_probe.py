"""scripts/parity_probe.py: the readings behind the README's account of why S2 runs stop extrapolating."""

import math

import torch
from conftest import compose
from parity_probe import gate_scaled, parity_pairs, token_angles

from duality.model import build_model


def s2_model():
    torch.manual_seed(0)
    cfg = compose(["task=state_tracking", "data=parity", "backbone=gla_st", "pe=selective_rope_st",
                   "model.d_model=32", "model.n_heads=2"])
    return build_model(cfg.backbone, cfg.pe, cfg.model, 3).eval()


def test_parity_pairs_rank_the_pi_flip_first_and_give_the_length_its_error_allows():
    angles = torch.zeros(2, 2, 3, dtype=torch.float64)  # [token, head, pair]
    angles[1] = 1.0
    angles[1, 1, 2] = math.pi + 0.01  # a 1 flips head 1's pair 2, almost exactly
    angles[0, 1, 2] = 2 * math.pi - 0.002  # a 0 turns it by a full turn, almost: no turn
    angles[1, 0, 0], angles[0, 0, 0] = 3 * math.pi, 0.5  # flips, but a 0 turns it too
    rows = parity_pairs(angles)
    assert (rows[0]["head"], rows[0]["pair"]) == (1, 2) and (rows[1]["head"], rows[1]["pair"]) == (0, 0)
    # wrapped to (-pi, pi]: the 1's turn relative to the 0's is pi + 0.012 - 2 pi, the 0's turn -0.002
    assert abs(rows[0]["err_1"] - 0.012) < 1e-9 and abs(rows[0]["err_0"] - 0.002) < 1e-9
    assert abs(rows[0]["length"] - math.pi / 0.014) < 1e-6


def test_token_angles_are_what_a_token_adds_through_the_convolution_and_temperature():
    model = s2_model()
    pe = model.blocks[0].mixer.pe
    with torch.no_grad():  # the angle from the bias alone, e^b per token: the same for both tokens
        pe.up.weight.zero_()
        pe.log_bias.copy_(torch.linspace(-1, 1, pe.log_bias.numel()).view_as(pe.log_bias))
    angles = token_angles(model, [0, 1], bos=2)
    want = (pe.log_bias.exp() * pe.theta).double()
    assert torch.allclose(angles[0], want, atol=1e-6) and torch.allclose(angles[1], want, atol=1e-6)
    with torch.no_grad():  # a token-dependent angle u = W x: in a run of one token the taps of the convolution add up
        pe.up.weight.normal_()
    angles = token_angles(model, [0, 1], bos=2)
    assert not torch.allclose(angles[0], angles[1])
    assert "increments" not in vars(pe)  # the spy is gone


def test_gate_scaled_changes_only_the_pair_and_only_inside():
    model = s2_model()
    x = torch.tensor([[2, 0, 1, 1, 0, 1, 0, 0, 1, 1]])
    with torch.no_grad():
        plain = model(x)[0]
        with gate_scaled(model, head=1, pair=3, c=1.0):
            same = model(x)[0]
        with gate_scaled(model, head=1, pair=3, c=0.0):
            kept = model(x)[0]
        after = model(x)[0]
    assert torch.equal(same, plain) and torch.equal(after, plain) and "recurrence" not in vars(model.blocks[0].mixer)
    assert not torch.allclose(kept, plain)
