"""scripts/frozen_weights.py: the check behind the finding in docs/synthetic that bf16 AdamW state froze the S2 runs."""

import pytest
import torch
from frozen_weights import compare, spacing


def run(dtype, steps=(40, 12000, 2000)):
    """A real AdamW on one parameter: large gradients, then tiny ones for long enough (12 time constants of
    beta2 = 0.999) that an fp32 v forgets the large ones; checkpoints (train.py's layout) after the last two phases."""
    torch.manual_seed(0)
    w = torch.nn.Parameter((torch.randn(512) * 0.05).to(dtype))
    opt = torch.optim.AdamW([w], lr=5e-4, weight_decay=1e-6, foreach=False)
    ckpts = []
    for scale, n in zip((1.0, 1e-4, 1e-4), steps):
        for _ in range(n):
            w.grad = (torch.randn(512) * scale).to(dtype)
            opt.step()
        sd = opt.state_dict()
        ckpts.append({"step": len(ckpts), "model": {"w": w.detach().clone()},
                      "optimizer": {"state": {"w": {k: v.clone() for k, v in sd["state"][0].items()}},
                                    "param_groups": sd["param_groups"]}})
    return ckpts[-2:]


@pytest.mark.slow
def test_bf16_adamw_state_freezes_and_fp32_does_not():
    r = compare(*run(torch.bfloat16))
    # v * 0.999 rounds back to v in bf16, v keeps the large gradients' size, and the steps round away
    assert r["v_decay_no_op"] == 1.0
    assert r["below_half_spacing"] > 0.99 and r["changed"] < 0.02
    r32 = compare(*run(torch.float32))
    assert r32["v_decay_no_op"] == 0.0 and r32["changed"] == 1.0 and r32["below_half_spacing"] == 0.0
    assert r32["median_step"] > 10 * r["median_step"]


def test_spacing_is_the_gap_to_the_next_number_of_the_dtype():
    x = torch.tensor([1.0, 0.3, -3.0, 1e-3]).to(torch.bfloat16).double().abs()
    s = spacing(x, torch.bfloat16).double()
    assert torch.equal((x + s).to(torch.bfloat16).double(), x + s)  # x + s is a bf16 number
    assert torch.equal((x + 0.49 * s).to(torch.bfloat16).double(), x)  # and nothing between rounds up to it
    assert torch.equal(x + s, torch.nextafter(x.to(torch.bfloat16), torch.tensor(9.0, dtype=torch.bfloat16)).double())
    assert spacing(torch.tensor([1.0]), torch.bfloat16).item() == 2 ** -7
    assert spacing(torch.tensor([1.0]), torch.float32).item() == 2 ** -23


def test_checkpoints_of_two_models_are_refused():
    a, b = run(torch.float32, steps=(1, 1, 1))
    b["model"] = {"v": b["model"]["w"]}
    with pytest.raises(SystemExit, match="not of one model"):
        compare(a, b)
