"""train.checkpoint_format=sharded: torch.distributed.checkpoint folders written by every rank at once, read back
whole on any world size and strategy, and everywhere a checkpoint is read (resume, eval.py, export)."""

import json
import shutil
import subprocess

import pytest
import torch
from conftest import ROOT, compose, metrics_rows, tiny_overrides, torchrun, torchrun_train

from duality import eval as eval_lib
from duality import train as train_lib
from duality.model import ConfigError
from duality.trainer.checkpoint import is_sharded, load_checkpoint, read_checkpoint
from duality.trainer.config import check_config

SHARDED = "train.checkpoint_format=sharded"


def losses(out_dir) -> dict:
    return {r["step"]: r["loss"] for r in metrics_rows(out_dir) if "loss" in r}


def cut_at(run, step: int) -> None:
    """The run as if killed after its step-`step` checkpoint: later checkpoints and metric rows removed."""
    for later in (run / "checkpoints").glob("step_*"):
        if int(later.name.removesuffix(".pt")[5:]) > step:
            shutil.rmtree(later) if later.is_dir() else later.unlink()
    name = next(p.name for p in (run / "checkpoints").glob(f"step_{step:07d}*"))
    (run / "checkpoints" / "latest").write_text(name)
    rows = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("".join(x + "\n" for x in rows if json.loads(x)["step"] <= step))


def test_sharded_resume_is_exact_and_holds_what_a_full_checkpoint_holds(tmp_path, data_cache):
    common = ["train.steps=8", "train.ckpt_interval=4", "optim.warmup=2", "train.keep_checkpoints=1"]
    train_lib.run(compose(tiny_overrides(tmp_path / "full", data_cache, *common)))
    train_lib.run(compose(tiny_overrides(tmp_path / "sh", data_cache, *common, SHARDED)))
    ckpts = sorted(p.name for p in (tmp_path / "sh" / "checkpoints").iterdir())
    assert ckpts == ["latest", "step_0000008"] and is_sharded(tmp_path / "sh" / "checkpoints" / "step_0000008")
    full, sharded = load_checkpoint(tmp_path / "full/checkpoints/step_0000008.pt"), read_checkpoint(tmp_path / "sh")[1]
    assert set(full) == set(sharded)
    for k, v in full["model"].items():
        assert torch.equal(v, sharded["model"][k]), k
    for name, st in full["optimizer"]["state"].items():
        for key, v in st.items():
            assert torch.equal(v, sharded["optimizer"]["state"][name][key]), (name, key)
    assert sharded["optimizer"]["param_groups"] == full["optimizer"]["param_groups"]
    assert losses(tmp_path / "sh") == losses(tmp_path / "full")
    # killed after step 4, resumed: every loss equal to the uninterrupted run's
    again = tmp_path / "again"
    train_lib.run(compose(tiny_overrides(again, data_cache, *[c for c in common if "keep" not in c], SHARDED)))
    cut_at(again, 4)
    train_lib.run(compose(tiny_overrides(again, data_cache, *common, SHARDED)))
    assert losses(again) == losses(tmp_path / "full")


def test_a_killed_sharded_save_leaves_no_checkpoint_and_is_cleared(tmp_path, data_cache):
    run = tmp_path / "run"
    train_lib.run(compose(tiny_overrides(run, data_cache, "train.steps=4", "train.ckpt_interval=2", SHARDED)))
    partial = run / "checkpoints" / "step_0000006.tmp"
    shutil.copytree(run / "checkpoints" / "step_0000004", partial)
    (partial / "meta.pt").unlink()  # killed before rank 0 added meta.pt
    assert read_checkpoint(run)[0].name == "step_0000004"
    train_lib.run(compose(tiny_overrides(run, data_cache, "train.steps=6", "train.ckpt_interval=2", SHARDED)))
    assert not partial.exists() and read_checkpoint(run)[0].name == "step_0000006"


def test_eval_and_export_read_a_sharded_checkpoint(tmp_path, data_cache):
    common = ["train.steps=6", "model.seq_len=64"]
    train_lib.run(compose(tiny_overrides(tmp_path / "full", data_cache, *common)))
    train_lib.run(compose(tiny_overrides(tmp_path / "sh", data_cache, *common, SHARDED)))
    ppl = [eval_lib.run(compose([f"ckpt={tmp_path / r}", "mode=perplexity", "eval_tokens=512",
                                 f"out={tmp_path}/{r}.json"], "eval"))["val_loss"] for r in ("full", "sh")]
    assert ppl[0] == ppl[1]
    out = tmp_path / "export"
    eval_lib.run(compose([f"ckpt={tmp_path / 'sh'}", "mode=export", f"out={out}"], "eval"))
    assert eval_lib.run(compose([f"ckpt={out}", "mode=perplexity", "eval_tokens=512", f"out={tmp_path}/e.json"],
                                "eval"))["val_loss"] == pytest.approx(ppl[0], rel=1e-6)


def test_an_unknown_format_names_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"train.checkpoint_format='zip'; valid choices: \['full', 'sharded'\]"):
        check_config(compose(tiny_overrides(tmp_path, tmp_path, "train.checkpoint_format=zip")))


@pytest.mark.slow
def test_fsdp_writes_shards_from_every_rank_and_resumes_on_another_world_size(tmp_path, data_cache):
    """FSDP2 over 2 gloo processes writes one file per rank (nothing gathered); its step-4 checkpoint resumes in one
    process, and a one-process checkpoint resumes under FSDP on two: both follow the one-process run's losses."""
    opts = ("train.steps=8", "train.micro_batch=2", "optim.warmup=2", "train.ckpt_interval=4",
            "train.keep_checkpoints=3")
    train_lib.run(compose(tiny_overrides(tmp_path / "ref", data_cache, *opts)))
    ref = losses(tmp_path / "ref")
    fsdp = tiny_overrides(tmp_path / "fsdp", data_cache, *opts, SHARDED, "train.strategy=fsdp")
    r = subprocess.run([*torchrun(2), "train.py", *fsdp], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    shards = sorted(p.name for p in (tmp_path / "fsdp/checkpoints/step_0000004").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"], shards
    got = losses(tmp_path / "fsdp")
    assert sorted(got) == list(range(1, 9)) and all(got[s] == pytest.approx(ref[s], rel=1e-5) for s in got)
    cut_at(tmp_path / "fsdp", 4)  # FSDP on 2 -> one process
    train_lib.run(compose(tiny_overrides(tmp_path / "fsdp", data_cache, *opts, SHARDED)))
    got = losses(tmp_path / "fsdp")
    assert sorted(got) == list(range(1, 9)) and all(got[s] == pytest.approx(ref[s], rel=1e-5) for s in got)
    one = tmp_path / "one"  # one process -> FSDP on 2
    train_lib.run(compose(tiny_overrides(one, data_cache, *opts, SHARDED)))
    cut_at(one, 4)
    r = torchrun_train(2, one, data_cache, *opts, SHARDED, "train.strategy=fsdp")
    assert r.returncode == 0, r.stderr[-3000:]
    got = losses(one)
    assert sorted(got) == list(range(1, 9)) and all(got[s] == pytest.approx(ref[s], rel=1e-5) for s in got)


def test_async_saves_publish_later_and_resume_exactly(tmp_path, data_cache):
    """train.async_checkpoint: training goes on while a save is written; each save is published (renamed, `latest`)
    by the next one or at the run's end; the checkpoints hold the state of their own step (copied before training
    went on), so a resume from the middle one is exact."""
    common = ["train.steps=9", "train.ckpt_interval=3", "optim.warmup=2", "train.keep_checkpoints=0", SHARDED]
    train_lib.run(compose(tiny_overrides(tmp_path / "sync", data_cache, *common)))
    train_lib.run(compose(tiny_overrides(tmp_path / "async", data_cache, *common, "train.async_checkpoint=true")))
    names = sorted(p.name for p in (tmp_path / "async" / "checkpoints").iterdir())
    assert names == ["latest", "step_0000003", "step_0000006", "step_0000009"]
    assert (tmp_path / "async" / "checkpoints" / "latest").read_text() == "step_0000009"
    for step in (3, 6, 9):
        a = load_checkpoint(tmp_path / f"sync/checkpoints/step_{step:07d}")
        b = load_checkpoint(tmp_path / f"async/checkpoints/step_{step:07d}")
        assert all(torch.equal(v, b["model"][k]) for k, v in a["model"].items()), step
    cut_at(tmp_path / "async", 6)
    train_lib.run(compose(tiny_overrides(tmp_path / "async", data_cache, *common, "train.async_checkpoint=true")))
    assert losses(tmp_path / "async") == losses(tmp_path / "sync")
    with pytest.raises(ConfigError, match="train.async_checkpoint=true needs train.checkpoint_format=sharded"):
        check_config(compose(tiny_overrides(tmp_path, tmp_path, "train.async_checkpoint=true")))


@pytest.mark.slow
def test_async_saves_under_fsdp_on_two_processes(tmp_path, data_cache):
    """Asynchronous sharded saves under FSDP2 on 2 gloo processes (the writer on a gloo group of its own): the run's
    losses follow the one-process run's, every save is published, and the middle one resumes in one process."""
    opts = ("train.steps=8", "train.micro_batch=2", "optim.warmup=2", "train.ckpt_interval=4", SHARDED)
    train_lib.run(compose(tiny_overrides(tmp_path / "ref", data_cache, *opts)))
    ref = losses(tmp_path / "ref")
    run = tmp_path / "fsdp"
    r = torchrun_train(2, run, data_cache, *opts, "train.strategy=fsdp", "train.async_checkpoint=true")
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_0000004", "step_0000008"]
    got = losses(run)
    assert sorted(got) == list(range(1, 9)) and all(got[s] == pytest.approx(ref[s], rel=1e-5) for s in got)
    cut_at(run, 4)
    train_lib.run(compose(tiny_overrides(run, data_cache, *opts)))
    got = losses(run)
    assert sorted(got) == list(range(1, 9)) and all(got[s] == pytest.approx(ref[s], rel=1e-5) for s in got)
