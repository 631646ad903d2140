"""scripts/parity_probe.py: the readings behind the account in docs/synthetic of why S2 runs stop extrapolating."""

import math

import torch
from conftest import compose
from parity_probe import bias_removed, error_periods, first_wrong, gate_scaled, parity_pairs, token_angles

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


def test_bias_removed_leaves_only_the_input_s_angle_and_puts_the_bias_back():
    model = s2_model()
    pe = model.blocks[0].mixer.pe
    with torch.no_grad():
        pe.log_bias.normal_()
    x = torch.tensor([[2, 0, 1, 1, 0, 1, 0, 0, 1, 1]])
    with torch.no_grad():
        plain = model(x)[0]
        with bias_removed(model):
            without = model(x)[0]
            pe.up.weight.zero_()  # no input angle either: no token turns any pair
            assert token_angles(model, [0, 1], bos=2).abs().max() == 0
        angles = token_angles(model, [0, 1], bos=2)  # the bias is back: e^b per token, for both tokens
    assert not torch.allclose(without, plain)
    want = (pe.log_bias.exp() * pe.theta).double()
    assert torch.allclose(angles[0], want, atol=1e-6) and torch.allclose(angles[1], want, atol=1e-6)


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


def test_error_periods_find_where_the_failures_recur():
    # right within 16; beyond it an error that cycles every 3 lengths and a weaker one every 8
    curve = {n: 1.0 - (n > 16) * (0.3 * (1 + math.cos(2 * math.pi * n / 3)) + 0.1 * (1 + math.cos(math.pi * n / 4)))
             for n in range(1, 16 + 240 + 1)}
    (p1, s1), (p2, s2), _ = error_periods(curve, after=16)
    assert abs(p1 - 3.0) < 1e-9 and abs(p2 - 8.0) < 1e-9 and s1 > s2 > 0
    assert error_periods({n: 0.9 + 0.05 * (n % 2) for n in range(1, 41)}, after=0, top=1)[0][0] == 2.0


class ParityUntil(torch.nn.Module):
    """Logits that give the running parity of tokens 0/1 after <bos> (2) up to position `until`, then its opposite."""

    def __init__(self, until: int):
        super().__init__()
        self.until = until

    def forward(self, x):
        parity = torch.cumsum(x[:, 1:] == 1, 1) % 2
        parity[:, self.until:] = 1 - parity[:, self.until:]
        answer = torch.cat([torch.zeros_like(x[:, :1]), parity], 1)
        return (torch.nn.functional.one_hot(answer, 3).float(),)


def test_first_wrong_is_the_first_position_off_the_running_parity():
    assert first_wrong(ParityUntil(7), token=1, bos=2, length=12) == 8
    assert first_wrong(ParityUntil(3), token=0, bos=2, length=12) == 4
    assert first_wrong(ParityUntil(12), token=1, bos=2, length=12) is None
    # the real model's answers, checked against the parity computed here
    model = s2_model()
    with torch.no_grad():
        answer = model(torch.tensor([[2] + [1] * 9]))[0][0, 1:, :2].argmax(-1)
    wrong = [t + 1 for t in range(9) if answer[t] != (t + 1) % 2]
    assert first_wrong(model, token=1, bos=2, length=9) == (wrong[0] if wrong else None)
