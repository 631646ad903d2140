"""scripts/bench_train.py: every case it names is a valid configuration, and its reference is the GPT-2 it claims."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_train  # noqa: E402


@pytest.mark.parametrize("case", list(bench_train.CASES))
def test_every_case_builds_and_trains_one_step(case):
    model, optim_cfg = bench_train.build(case, "tiny", 32, 128)
    x = torch.randint(0, 128, (2, 33))
    _, loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    assert torch.isfinite(loss) and model.flops_per_token(32) > 6 * 0.9 * model.num_params(True)


def test_reference_is_gpt2_small():
    ref, _ = bench_train.build("ref", "124m", 1024, 50304)
    n = sum(p.numel() for p in ref.parameters())
    # GPT-2 small, bias-free, tied head, 50,304-token vocabulary: nanoGPT prints 123.59M (without the position table)
    assert n - 1024 * 768 == 123_587_328
    gpt, _ = bench_train.build("transformer+rope", "124m", 1024, 50304)
    # the same FLOP convention: 6 x matmul parameters + 3 x the causal attention's forward FLOPs
    matmul = sum(p.numel() for n, p in ref.named_parameters() if n.startswith("blocks")) + 50304 * 768
    attention = 3 * sum(b.mixer.flops_per_token(1024) for b in gpt.blocks)
    assert ref.flops_per_token(1024) == 6 * matmul + attention


def test_overrides_reach_every_case():
    model, _ = bench_train.build("fox+nope", "tiny", 32, 128, ["model.fused_loss=true", "+backbone.short_conv=true"])
    assert model.cfg.fused_loss and model.blocks[0].mixer.conv is not None
    with pytest.raises(Exception, match="no_such_key"):
        bench_train.build("transformer+rope", "tiny", 32, 128, ["model.no_such_key=1"])


def test_outputs_of_a_run_whose_cases_all_failed(tmp_path):
    rows = [{"case": "transformer+rope", "size": "124m", "seq_len": 1024, "compile": True,
             "error": "OutOfMemoryError: CUDA out of memory"}]
    assert "OutOfMemoryError" in bench_train.table(rows)
    bench_train.plot(rows, tmp_path / "b.png")  # nothing to draw: no figure, no error
    assert not (tmp_path / "b.png").exists()
