"""train.py and eval.py as a user runs them: config composition, errors before work, overfitting, exact resume,
DDP, sweeps, wandb, and evaluation of the checkpoint."""

import contextlib
import itertools
import json
import math
import re
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, compose, metrics_rows, spawn_ranks, tiny_overrides, torchrun, torchrun_train

from duality import eval as eval_lib
from duality import train as train_lib
from duality.model import ConfigError, build_model, valid_schemes
from duality.trainer.checkpoint import load_checkpoint, save_checkpoint
from duality.trainer.config import check_config
from duality.trainer.optim import lr_lambda, make_optimizer


def options(group):
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


@pytest.mark.slow
def test_compose_every_combination():
    """Every backbone x pe (valid ones pass every check, the others are refused with the valid choices), and
    every model x train x optim x logger x data choice."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        for b, p in itertools.product(options("backbone"), options("pe")):
            cfg = hydra_compose("config", overrides=[f"backbone={b}", f"pe={p}"])
            # presets: gla_st is gla, selective_rope_pg is selective_rope
            assert b.startswith(cfg.backbone.name) and p.startswith(cfg.pe.name)
            if cfg.pe.name in valid_schemes(cfg.backbone.name):
                check_config(cfg)
            else:
                with pytest.raises(ConfigError, match="valid pe for backbone"):
                    check_config(cfg)
        for m, o, lg, d in itertools.product(options("model"), options("optim"), options("logger"), options("data")):
            cfg = hydra_compose("config", overrides=[f"model={m}", f"optim={o}", f"logger={lg}", f"data={d}"])
            named = OmegaConf.load(ROOT / "conf" / "data" / f"{d}.yaml").name  # parity, a3, s3 are state_tracking
            assert cfg.model.name == m and cfg.data.name == named and cfg.train.global_batch_tokens > 0
            if cfg.data.get("seq_len", 0) > cfg.model.seq_len:  # copying's 419-token rows beside model=tiny's 256
                with pytest.raises(ConfigError, match=f"set model.seq_len={cfg.data.seq_len}"):
                    check_config(cfg)
            else:
                check_config(cfg)


@pytest.mark.parametrize("size,vocab,expect", [("124m", 50304, 124e6), ("370m", 32000, 370e6), ("1_3b", 32000, 1.36e9)])
def test_model_sizes(size, vocab, expect):
    cfg = compose([f"model={size}"])
    with torch.device("meta"):
        m = build_model(cfg.backbone, cfg.pe, cfg.model, vocab)
    assert abs(m.num_params() - expect) / expect < 0.03, m.num_params()


def test_unknown_group_option_lists_choices():
    from hydra.errors import MissingConfigException
    with pytest.raises(MissingConfigException, match="rope"):
        compose(["pe=ropee"])


@pytest.mark.parametrize("override,match", [
    ("train.global_batch_tokens=1000", "not a multiple of micro_batch"),
    ("optim.schedule=exponential", r"valid choices: \['cosine', 'wsd', 'linear', 'constant'\]"),
    ("logger.mode=maybe", "valid choices"),
    ("model.n_heads=3", "does not divide"),
    ("resume=/nonexistent.pt", "not a checkpoint file"),
    ("train.steps=0", "steps"),
    ("train.profile_steps=-1", "integer >= 0"),
    ("train.profile_after=-2", r"train.profile_after=-2: the steps before profiling, an integer >= 0"),
    ("train.strategy=zero3", r"valid choices: \['ddp', 'fsdp'\]"),
    ("train.fsdp_reshard=sometimes", "train.fsdp_reshard='sometimes'; valid choices: auto, true, false"),
    ("train.fsdp_prefetch=-1", r"train.fsdp_prefetch=-1; valid choices: 0 \(FSDP2's own order\) or the number"),
    ("train.fsdp_prefetch=true", r"train.fsdp_prefetch=True; valid choices: 0 \(FSDP2's own order\) or the number"),
    ("train.fsdp_param_dtype=half", "train.fsdp_param_dtype='half'; valid choices: float32, bfloat16"),
    ("train.float8=fp8", r"train.float8='fp8'; valid choices: \['none', 'tensorwise', 'rowwise'\]"),
    ("train.float8=tensorwise", r"train.float8=tensorwise needs a GPU of compute capability >= 8.9 \(Ada, Hopper\); "
                                "this run's device is cpu"),
    ("train.fsdp_param_dtype=bfloat16", r"is FSDP2's: it needs train.strategy=fsdp \(got ddp\)"),
    ("train.compile_mode=fast", r"valid choices: \['default', 'max-autotune-no-cudagraphs'"),
    ("model.sparse_loss=true", "needs model.fused_loss=true"),
    ("model.mlp_impl=liger", r"model.mlp_impl='liger'; valid choices: \['inductor', 'quack'\]"),
    ("model.fused_loss_impl=fast", r"valid choices: \['auto', 'triton', 'chunked'\]"),
])
def test_bad_config_fails_before_work(tmp_path, override, match):
    with pytest.raises(ConfigError, match=match):
        train_lib.run(compose([f"out_dir={tmp_path}", override]))
    assert not (tmp_path / "checkpoints").exists()


def test_float8_converts_the_trunks_linears_and_keeps_their_names():
    """train.float8 (trainer/runtime.py: float8_linears): torchao's Float8Linear in place of every trunk Linear, the
    head kept (the fused loss reads its weight), the state dict's names unchanged (checkpoints load without float8).
    torchao is not a dependency: this runs where it is installed."""
    pytest.importorskip("torchao.float8")
    from torchao.float8.float8_linear import Float8Linear

    from duality.trainer.runtime import float8_linears
    model = build_model({"name": "transformer"}, {"name": "rope"}, {"n_layer": 2, "d_model": 32, "n_heads": 2,
                                                                    "seq_len": 16, "tie_embeddings": False}, 64)
    linears = [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]
    names = list(model.state_dict())
    float8_linears(model, "rowwise")
    converted = [n for n, m in model.named_modules() if isinstance(m, Float8Linear)]
    assert converted and set(converted) == {n for n in linears if n != "lm_head"}
    assert type(model.lm_head) is torch.nn.Linear and list(model.state_dict()) == names


def test_quack_mlp_without_the_package_on_cuda_fails_before_work(tmp_path, monkeypatch):
    """model.mlp_impl=quack on a CUDA machine without quack-kernels: an error naming the package and the way out;
    on a CPU machine the same config trains (the SwiGLU's PyTorch form, the same function)."""
    import duality.model.core.layers as layers
    monkeypatch.setattr(layers, "quack_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ConfigError, match=r"pip install quack-kernels\); model.mlp_impl=inductor runs without it"):
        train_lib.run(compose([f"out_dir={tmp_path}", "model.mlp_impl=quack"]))
    assert not (tmp_path / "checkpoints").exists()
    monkeypatch.undo()
    m = build_model({"name": "gla"}, {"name": "nope"}, {"n_layer": 1, "d_model": 32, "n_heads": 2, "seq_len": 16,
                                                        "mlp_impl": "quack"}, 64)
    assert m.blocks[0].mlp.quack is (torch.cuda.is_available() and layers.quack_available())  # CPU: PyTorch form


def test_bf16_weights_with_a_beta2_bf16_cannot_decay_is_warned_about(capsys):
    """0.999 (the default, and seed 004's): v * 0.999 rounds back to v in bf16 (tests/test_frozen_weights.py shows the
    run freezing); 0.99 decays; fp32 weights keep the state in fp32."""
    for dtype, beta2, warned in (("bf16_weights", 0.999, True), ("bf16_weights", 0.99, False), ("bf16", 0.999, False)):
        check_config(compose([f"train.dtype={dtype}", f"optim.betas=[0.9,{beta2}]"]))
        assert ("the second moment never decays" in capsys.readouterr().err) == warned, (dtype, beta2)
    v = torch.tensor([1.0, 1.5, 1.99, 3e-4], dtype=torch.bfloat16)
    assert torch.equal(v * 0.999, v) and not torch.equal(v * 0.99, v)  # the rule the warning applies


@pytest.mark.parametrize("ac,scope", [("none", "model"), ("full", "model"), ("none", "blocks"), ("full", "blocks")])
def test_compile_mode_reaches_torch_compile(tmp_path, data_cache, monkeypatch, ac, scope):
    """train.compile_mode is the mode of every torch.compile call train.py makes: the model's (scope model), or each
    block's step and the head's (scope blocks), and each block's forward under full checkpointing; the spy compiles
    nothing, the run trains eagerly."""
    modes = []

    def spy(fn, mode=None, **kw):
        modes.append(mode)
        return fn
    monkeypatch.setattr(torch, "compile", spy)
    train_lib.run(compose(tiny_overrides(tmp_path, data_cache, "train.steps=2", "train.compile=true",
                                         "train.compile_mode=max-autotune-no-cudagraphs",
                                         f"train.activation_checkpointing={ac}", f"train.compile_scope={scope}")))
    n_layer = 2  # tiny_overrides'
    n = (n_layer if ac == "full" else 0) + (n_layer + 1 if scope == "blocks" else 1)
    assert modes == ["max-autotune-no-cudagraphs"] * n


@pytest.mark.parametrize("backbone", options("backbone"))
@pytest.mark.slow
def test_tiny_model_overfits_a_batch(backbone):
    torch.manual_seed(0)
    pe = "nope" if backbone.startswith("path") or backbone == "base_conv" else "rope"
    cfg = compose([f"backbone={backbone}", f"pe={pe}", "model.n_layer=2", "model.d_model=64", "model.seq_len=32"])
    m = build_model(cfg.backbone, cfg.pe, cfg.model, 128)
    opt = make_optimizer(m, cfg.optim, fused=False)
    x = torch.randint(0, 128, (4, 33))
    for _ in range(150):
        loss = m(x[:, :-1], x[:, 1:])[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05, loss.item()


def _losses(out_dir):
    rows = [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_resume_reproduces_every_loss_exactly(tmp_path, data_cache):
    common = ["train.steps=8", "train.ckpt_interval=4", "optim.warmup=2"]
    full = train_lib.run(compose(tiny_overrides(tmp_path / "a", data_cache, *common)))
    # the same run, interrupted after its step-4 checkpoint: remove what steps 5..8 left behind
    b = tmp_path / "b"
    train_lib.run(compose(tiny_overrides(b, data_cache, *common)))
    (b / "checkpoints" / "step_0000008.pt").unlink()
    (b / "checkpoints" / "latest").write_text("step_0000004.pt")
    lines = (b / "metrics.jsonl").read_text().splitlines()
    (b / "metrics.jsonl").write_text("".join(x + "\n" for x in lines if json.loads(x)["step"] <= 4))
    resumed = train_lib.run(compose(tiny_overrides(b, data_cache, *common, "resume=auto")))
    a_loss, b_loss = _losses(tmp_path / "a"), _losses(b)
    assert sorted(b_loss) == list(range(1, 9))
    assert all(a_loss[s] == b_loss[s] for s in range(1, 9)), (a_loss, b_loss)
    assert full["loss"] == resumed["loss"] and full["val_loss"] == resumed["val_loss"]
    assert a_loss[8] < a_loss[1]


def test_logged_loss_is_the_mean_since_the_last_row_across_evaluations(tmp_path, data_cache):
    """A log row after evaluations and checkpoints (which restart the throughput clock) still averages every step
    since the previous row: once every 6 steps == the mean of the 6 per-step rows (it divided the sum by the steps since
    the last restart: 3x here)."""
    every = train_lib.run(compose(tiny_overrides(tmp_path / "a", data_cache, "train.steps=6")))
    rare = train_lib.run(compose(tiny_overrides(tmp_path / "b", data_cache, "train.steps=6", "train.log_interval=100",
                                                "train.eval_interval=2", "train.ckpt_interval=4")))
    losses = _losses(tmp_path / "a")
    assert sorted(_losses(tmp_path / "b")) == [6]
    assert rare["loss"] == pytest.approx(sum(losses.values()) / 6, rel=1e-6), (rare["loss"], losses)
    assert every["loss"] == losses[6]


def test_doc_boundaries_train_and_validate_on_packed_documents(tmp_path, data_cache):
    """train.doc_boundaries: the same windows, packed with documents kept apart: other losses than without (tokens
    after an end-of-text no longer see the previous document), still learning; refused for synthetic tasks."""
    common = ["train.steps=5", "optim.warmup=1", "train.micro_batch=8", "model.seq_len=128",
              "train.global_batch_tokens=1024", "train.eval_tokens=4096"]  # documents end in steps 3 and 5
    plain = train_lib.run(compose(tiny_overrides(tmp_path / "a", data_cache, *common)))
    packed = train_lib.run(compose(tiny_overrides(tmp_path / "b", data_cache, *common, "train.doc_boundaries=true")))
    a, b = _losses(tmp_path / "a"), _losses(tmp_path / "b")
    assert a[1] == b[1] and a[3] != b[3] and b[5] < b[1] and math.isfinite(packed["val_loss"])
    assert packed["val_loss"] != plain["val_loss"]
    ev = eval_lib.run(compose([f"ckpt={tmp_path / 'b'}", "mode=perplexity", "eval_tokens=4096", "micro_batch=8"],
                              "eval"))
    assert ev["val_loss"] == pytest.approx(packed["val_loss"], rel=1e-6)  # evaluated as it was trained
    with pytest.raises(ConfigError, match="doc_boundaries packs text documents"):
        train_lib.run(compose(["task=mqar", "train.doc_boundaries=true", f"out_dir={tmp_path / 'c'}"]))


def test_fused_loss_trains_like_the_plain_loss_and_the_profiler_writes_its_table(tmp_path, data_cache):
    common = ["train.steps=6", "optim.warmup=2"]
    plain = train_lib.run(compose(tiny_overrides(tmp_path / "a", data_cache, *common)))
    fused = train_lib.run(compose(tiny_overrides(tmp_path / "b", data_cache, *common, "model.fused_loss=true",
                                                 "train.profile_steps=2", "train.profile_after=2")))
    a, b = _losses(tmp_path / "a"), _losses(tmp_path / "b")
    assert sorted(a) == sorted(b) == list(range(1, 7))
    assert all(b[s] == pytest.approx(a[s], rel=1e-5) for s in a), (a, b)
    assert fused["val_loss"] == pytest.approx(plain["val_loss"], rel=1e-5)
    ops = (tmp_path / "b" / "profile" / "ops.txt").read_text()
    assert "aten::mm" in ops
    trace = json.loads((tmp_path / "b" / "profile" / "trace.json").read_text())["traceEvents"]
    # the two steps after the first two (train.profile_after=2), and no other
    assert {e["name"] for e in trace if e.get("name", "").startswith("ProfilerStep#")} == {"ProfilerStep#2",
                                                                                           "ProfilerStep#3"}


def test_resume_refuses_other_model_and_broken_checkpoint(tmp_path, data_cache):
    train_lib.run(compose(tiny_overrides(tmp_path, data_cache, "train.steps=2")))
    with pytest.raises(ConfigError, match=r"cannot resume: pe was rope, now alibi. Resume with the checkpoint's "
                                          r"values \(pe=rope\)"):
        train_lib.run(compose(tiny_overrides(tmp_path, data_cache, "train.steps=4", "pe=alibi")))
    # a changed optimiser setting is named, with the override that continues the run (issue #76: both dicts, ~450
    # characters, were printed)
    with pytest.raises(ConfigError) as e:
        train_lib.run(compose(tiny_overrides(tmp_path, data_cache, "train.steps=4", "optim.lr=1e-3")))
    assert str(e.value).startswith("cannot resume: optim.lr was 0.003, now 0.001. Resume with the checkpoint's "
                                   "values (optim.lr=0.003)") and len(str(e.value)) < 200, str(e.value)
    with pytest.raises(ConfigError, match="resume=never"):
        train_lib.run(compose(tiny_overrides(tmp_path, data_cache, "train.steps=4", "resume=never")))
    path = tmp_path / "checkpoints" / "step_0000002.pt"
    ck = torch.load(path, weights_only=False)  # as if written by an older version of the mixer
    ck["model"]["blocks.0.mixer.q_proj.weight"] = ck["model"].pop("blocks.0.mixer.qkv.weight")
    torch.save(ck, path)
    for load in (lambda: train_lib.run(compose(tiny_overrides(tmp_path, data_cache, "train.steps=4"))),
                 lambda: eval_lib.load_model(str(tmp_path))):
        with pytest.raises(ConfigError, match=r"do not fit.*missing \['blocks\.0\.mixer\.qkv\.weight'\], "
                                              r"unexpected \['blocks\.0\.mixer\.q_proj\.weight'\]"):
            load()
    path.write_bytes(b"garbage")
    with pytest.raises(ConfigError, match="cannot read checkpoint"):
        train_lib.run(compose(tiny_overrides(tmp_path, data_cache, "train.steps=4")))


def test_a_checkpoint_without_a_newer_model_option_resumes_with_its_default(tmp_path, data_cache):
    """A run written before a model option existed (here model.conv_init_std) had its default: it resumes under the
    default and is refused under another value."""
    train_lib.run(compose(tiny_overrides(tmp_path, data_cache, "train.steps=2")))
    path = tmp_path / "checkpoints" / "step_0000002.pt"
    ck = torch.load(path, weights_only=False)
    del ck["config"]["model"]["conv_init_std"]
    torch.save(ck, path)
    with pytest.raises(ConfigError, match="cannot resume: model.conv_init_std was"):
        train_lib.run(compose(tiny_overrides(tmp_path, data_cache, "train.steps=4", "model.conv_init_std=0.02")))
    train_lib.run(compose(tiny_overrides(tmp_path, data_cache, "train.steps=3")))
    assert sorted(_losses(tmp_path)) == [1, 2, 3]


def test_bf16_weights_trains_a_bf16_model_and_resumes(tmp_path, data_cache):
    """train.dtype=bf16_weights (seed 004's code: the model cast to bf16 under bf16 autocast): weights, AdamW state and
    checkpoints in bf16; it trains (the loss falls) and resumes."""
    common = ["backbone=gla", "pe=rope", "train.dtype=bf16_weights", "optim.lr=1e-2"]
    train_lib.run(compose(tiny_overrides(tmp_path, data_cache, "train.steps=6", *common)))
    ck = torch.load(tmp_path / "checkpoints" / "step_0000006.pt", weights_only=False)
    assert {v.dtype for v in ck["model"].values() if v.is_floating_point()} == {torch.bfloat16}
    state = [s for s in ck["optimizer"]["state"].values()]
    assert state and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.bfloat16 for s in state)
    losses = _losses(tmp_path)
    assert losses[6] < losses[1] and all(math.isfinite(v) for v in losses.values())
    train_lib.run(compose(tiny_overrides(tmp_path, data_cache, "train.steps=7", *common)))
    assert sorted(_losses(tmp_path)) == list(range(1, 8))


def test_checkpoint_write_is_atomic(tmp_path):
    d = tmp_path / "ck"
    save_checkpoint(d, 1, {"x": 1}, keep=2)
    save_checkpoint(d, 2, {"x": 2}, keep=2)
    save_checkpoint(d, 3, {"x": 3}, keep=2)
    assert sorted(p.name for p in d.iterdir()) == ["latest", "step_0000002.pt", "step_0000003.pt"]
    assert (d / "latest").read_text() == "step_0000003.pt"


def test_schedules():
    o = compose([]).optim
    f = lr_lambda(o, 100)
    assert f(0) < f(9) <= 1.0 and f(10) == pytest.approx(1.0) and f(99) == pytest.approx(o.min_lr_ratio, abs=1e-3)
    w = lr_lambda(compose(["optim.schedule=wsd"]).optim, 100)
    assert w(50) == 1.0 and w(79) == 1.0 and w(90) < 1.0 and w(100) == pytest.approx(o.min_lr_ratio)


def _python(*args, drop=(), **kw):
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env, **kw)


@pytest.mark.slow
def test_resume_on_another_world_size_with_torchrun(tmp_path, data_cache):
    """1 process to step 4, then 2 DDP processes (gloo, CPU; with activation checkpointing) to step 8: the same
    global batches, so the losses match the uninterrupted single-process run up to float summation order."""
    common = tiny_overrides(tmp_path / "ddp", data_cache, "train.steps=8", "train.ckpt_interval=4",
                            "train.micro_batch=2", "optim.warmup=2")
    ref = tiny_overrides(tmp_path / "ref", data_cache, "train.steps=8", "train.micro_batch=2", "optim.warmup=2")
    train_lib.run(compose(ref))
    train_lib.run(compose(common))
    (tmp_path / "ddp" / "checkpoints" / "step_0000008.pt").unlink()
    (tmp_path / "ddp" / "checkpoints" / "latest").write_text("step_0000004.pt")
    (tmp_path / "ddp" / "metrics.jsonl").unlink()
    r = subprocess.run([*torchrun(2), "train.py", *common, "train.activation_checkpointing=full"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming a 1-process run on 2" in r.stderr
    a, b = _losses(tmp_path / "ref"), _losses(tmp_path / "ddp")
    assert sorted(b) == [5, 6, 7, 8]
    for s in b:
        assert b[s] == pytest.approx(a[s], rel=1e-5)


@pytest.mark.slow
def test_fsdp_matches_one_process_and_checkpoints_cross_strategies(tmp_path, data_cache):
    """train.strategy=fsdp (FSDP2 over 2 gloo processes, selective activation checkpointing) resumes a 1-process
    checkpoint and follows the 1-process run's losses; its own checkpoint then resumes in 1 process and still follows
    them."""
    opts = ("train.steps=8", "train.micro_batch=2", "optim.warmup=2")
    train_lib.run(compose(tiny_overrides(tmp_path / "ref", data_cache, *opts, "train.ckpt_interval=4",
                                         "train.keep_checkpoints=3")))
    ref = _losses(tmp_path / "ref")
    (tmp_path / "fsdp" / "checkpoints").mkdir(parents=True)
    os.link(tmp_path / "ref" / "checkpoints" / "step_0000004.pt", tmp_path / "fsdp" / "checkpoints" / "step_0000004.pt")
    fsdp = tiny_overrides(tmp_path / "fsdp", data_cache, *opts, "train.ckpt_interval=2", "train.strategy=fsdp",
                          "train.activation_checkpointing=selective")
    r = subprocess.run([*torchrun(2), "train.py", *fsdp], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "x world 2 (FSDP)" in r.stdout
    got = _losses(tmp_path / "fsdp")
    assert sorted(got) == [5, 6, 7, 8] and all(got[s] == pytest.approx(ref[s], rel=1e-5) for s in got), (got, ref)
    ck = torch.load(tmp_path / "fsdp" / "checkpoints" / "step_0000006.pt", weights_only=False)
    assert ck["strategy"] == "fsdp" and all(isinstance(k, str) for k in ck["optimizer"]["state"])
    (tmp_path / "one" / "checkpoints").mkdir(parents=True)
    os.link(tmp_path / "fsdp" / "checkpoints" / "step_0000006.pt", tmp_path / "one" / "checkpoints" / "step_0000006.pt")
    train_lib.run(compose(tiny_overrides(tmp_path / "one", data_cache, *opts)))
    one = _losses(tmp_path / "one")
    assert sorted(one) == [7, 8] and all(one[s] == pytest.approx(ref[s], rel=1e-5) for s in one), (one, ref)


@pytest.mark.slow
def test_fsdp_with_parameters_kept_gathered_trains_and_saves_as_resharded(tmp_path, data_cache):
    """train.fsdp_reshard=false (parameters gathered once a step, kept through the micro-batches, validation and the
    save): the same losses, validation losses and checkpoint as the one-process run."""
    opts = ("train.steps=6", "train.micro_batch=1", "optim.warmup=2", "train.eval_interval=2", "train.ckpt_interval=3")
    train_lib.run(compose(tiny_overrides(tmp_path / "ref", data_cache, *opts)))
    r = torchrun_train(2, tmp_path / "kept", data_cache, *opts, "train.strategy=fsdp",
                       "train.fsdp_reshard=false")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "grad_accum 4 x world 2 (FSDP)" in r.stdout, r.stdout[-2000:]
    rows = {k: {(x["step"], x.get("loss"), x.get("val_loss")) for x in metrics_rows(tmp_path / k)}
            for k in ("ref", "kept")}
    ref = {(s, "val" if v is not None else "train"): v if v is not None else lo for s, lo, v in rows["ref"]}
    got = {(s, "val" if v is not None else "train"): v if v is not None else lo for s, lo, v in rows["kept"]}
    assert set(got) == set(ref) and all(got[k] == pytest.approx(ref[k], rel=1e-5) for k in ref), (got, ref)
    a, b = (torch.load(tmp_path / k / "checkpoints" / "step_0000006.pt", weights_only=False) for k in ("ref", "kept"))
    for name, w in a["model"].items():
        torch.testing.assert_close(b["model"][name], w, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def _gathered_rank(rank: int, world: int, reshard: bool, out: str):
    from torch.distributed.tensor import DTensor

    from duality.model import build_model
    from duality.trainer.runtime import Runtime
    rt = Runtime(rank=rank, world=world, distributed=True, fsdp=True, fsdp_reshard=reshard)
    model = rt.prepare(build_model({"name": "transformer"}, {"name": "rope"}, {"n_layer": 2, "d_model": 32,
                                                                              "n_heads": 2, "seq_len": 16}, 64))
    rt.wrap(model, compile=False)
    idx = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(rank))
    sharded = []
    with rt.no_sync():  # a micro-batch before the step's last
        model(idx[:, :16], idx[:, 1:])[1].backward()
    sharded.append(isinstance(model.blocks[0].mixer.qkv.weight, DTensor))
    model(idx[:, :16], idx[:, 1:])[1].backward()  # the last: gradients reduced, parameters re-sharded
    sharded.append(isinstance(model.blocks[0].mixer.qkv.weight, DTensor))
    torch.save(sharded, f"{out}.{rank}")


def _bf16_gather_rank(rank: int, world: int, out: str):
    from torch.distributed.tensor import DTensor

    from duality.model import build_model
    from duality.trainer.runtime import Runtime
    seen = {}
    for dtype in ("float32", "bfloat16"):
        rt = Runtime(rank=rank, world=world, distributed=True, fsdp=True, fsdp_reshard=False, bf16=True,
                     fsdp_param_dtype=dtype)
        torch.manual_seed(0)
        model = rt.prepare(build_model({"name": "transformer"}, {"name": "rope"},
                                       {"n_layer": 2, "d_model": 32, "n_heads": 2, "seq_len": 16}, 64))
        rt.wrap(model, compile=False)
        idx = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(rank))
        with rt.no_sync(), torch.autocast("cpu", dtype=torch.bfloat16):  # a micro-batch before the last
            loss = model(idx[:, :16], idx[:, 1:])[1]
            loss.backward()
        w = model.blocks[0].mixer.qkv.weight  # kept gathered: the computed-with parameter
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(idx[:, :16], idx[:, 1:])[1].backward()  # the step's last: reduced, re-sharded
        p = model.blocks[0].mixer.qkv.weight
        seen[dtype] = (str(w.dtype), isinstance(p, DTensor), str(p.dtype), str(p.grad.dtype), float(loss))
    torch.save(seen, f"{out}.{rank}")


@pytest.mark.slow
def test_fsdp_param_dtype_bfloat16_gathers_in_bf16_and_keeps_fp32_shards(tmp_path):
    """train.fsdp_param_dtype=bfloat16 (FSDP2's MixedPrecisionPolicy): the gathered parameters a forward computes with
    are bf16, the shards (AdamW's) and their reduced gradients stay fp32, and the first loss is float32-gather's to
    bf16 rounding; refused for an fp32 run before any work."""
    spawn_ranks(_bf16_gather_rank, 2, str(tmp_path / "r"))
    for r in range(2):
        seen = torch.load(tmp_path / f"r.{r}")
        assert seen["float32"][:4] == ("torch.float32", True, "torch.float32", "torch.float32")
        assert seen["bfloat16"][:4] == ("torch.bfloat16", True, "torch.float32", "torch.float32")
        assert seen["bfloat16"][4] == pytest.approx(seen["float32"][4], rel=2e-2)
    with pytest.raises(ConfigError, match=r"fsdp_param_dtype=bfloat16 computes a bf16-autocast run's parameters in "
                                          r"bf16; this run's train.dtype=fp32 is fp32"):
        train_lib.run(compose([f"out_dir={tmp_path / 'x'}", "train.strategy=fsdp", "train.fsdp_param_dtype=bfloat16",
                               "train.dtype=fp32"]))
    assert not (tmp_path / "x").exists()


def _prefetch_rank(rank: int, world: int, out: str):

    from duality.model import build_model
    from duality.trainer.runtime import Runtime
    seen = {}
    for k in (0, 2):
        rt = Runtime(rank=rank, world=world, distributed=True, fsdp=True, fsdp_reshard=True, fsdp_prefetch=k)
        torch.manual_seed(0)
        model = rt.prepare(build_model({"name": "transformer"}, {"name": "rope"},
                                       {"n_layer": 4, "d_model": 32, "n_heads": 2, "seq_len": 16}, 64))
        blocks = list(model.blocks)
        order = [[blocks.index(s._modules[0]) for s in getattr(x._get_fsdp_state(), f"_states_to_{d}_prefetch")]
                 for x in [model, *blocks] for d in ("forward", "backward")]
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        idx = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(rank))
        losses = []
        for _ in range(3):
            loss = model(idx[:, :16], idx[:, 1:])[1]
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        seen[k] = (order, losses)
    torch.save(seen, f"{out}.{rank}")


@pytest.mark.slow
def test_fsdp_prefetch_gathers_blocks_ahead_with_the_same_losses(tmp_path):
    """train.fsdp_prefetch=2: the root gathers blocks 0 and 1 ahead, block i the next two in forward and the two
    before it (nearest first) in backward; three SGD steps lose exactly what FSDP2's own order loses."""
    spawn_ranks(_prefetch_rank, 2, str(tmp_path / "r"))
    for r in range(2):
        seen = torch.load(tmp_path / f"r.{r}")
        assert seen[0][0] == [[]] * 10
        assert seen[2][0] == [[0, 1], [], [1, 2], [], [2, 3], [0], [3], [1, 0], [], [2, 1]]
        assert seen[2][1] == seen[0][1] and seen[0][1][2] < seen[0][1][0], seen


def _eval_model(vocab: int):
    torch.manual_seed(0)
    return build_model({"name": "transformer"}, {"name": "rope"}, {"n_layer": 2, "d_model": 32, "n_heads": 2,
                                                                   "seq_len": 64}, vocab)


def _uneven_eval_rank(rank: int, world: int, out: str, shard: str, task_cfg: dict):
    from duality.data import TokenWindows, tasks
    from duality.trainer.objective import validation_loss
    from duality.trainer.runtime import Runtime
    rt = Runtime(rank=rank, world=world, distributed=True, fsdp=True, fsdp_reshard=True)
    val = validation_loss(rt.prepare(_eval_model(256)), TokenWindows([shard], 16, shuffle=False), 3, 1, "cpu",
                          contextlib.nullcontext(), rank, 2)
    task = tasks.build(task_cfg)
    m = tasks.evaluate(rt.prepare(_eval_model(len(task.symbols))), task, 2, "cpu", None, rank, 2)
    torch.save((val, m["val_loss"], m["val_acc"]), f"{out}.{rank}")


@pytest.mark.slow
def test_fsdp_evaluation_with_fewer_examples_than_ranks_runs_every_forward(tmp_path):
    """Under FSDP2 every forward gathers parameters with every rank, so a rank with fewer validation windows or task
    examples than another runs an uncounted forward for each one it lacks. Before, 3 windows over 2 ranks (one each
    in the first round, one for rank 0 alone in the second) hung rank 0 in its gather (370m/1.3B FSDP2 runs on 4 H200s
    hung after their last step, 2026-11-27): now the losses and accuracy equal one unsharded process's."""

    from duality.data import TokenWindows, tasks
    from duality.data.shards import write_shard
    from duality.trainer.objective import validation_loss
    write_shard(tmp_path / "v.bin", np.random.default_rng(0).integers(0, 256, 3 * 16 + 1), 256)
    from omegaconf import OmegaConf
    task_cfg = {**OmegaConf.to_container(compose(["data=mqar"]).data), "train_examples": 8, "test_examples": 3}
    # a short timeout: ranks whose forwards do not pair up fail within seconds instead of hanging the test
    spawn_ranks(_uneven_eval_rank, 2, str(tmp_path / "r"), str(tmp_path / "v.bin"), task_cfg, timeout_s=60)
    val = validation_loss(_eval_model(256), TokenWindows([tmp_path / "v.bin"], 16, shuffle=False), 3, 1, "cpu",
                          contextlib.nullcontext())
    task = tasks.build(task_cfg)
    m = tasks.evaluate(_eval_model(len(task.symbols)), task, 2, "cpu")
    for r in range(2):
        got = torch.load(tmp_path / f"r.{r}")
        assert got == pytest.approx((val, m["val_loss"], m["val_acc"]), rel=1e-5), (got, val, m)


@pytest.mark.slow
@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp_reshard_false_keeps_parameters_gathered_between_micro_batches(tmp_path, reshard):
    spawn_ranks(_gathered_rank, 2, reshard, str(tmp_path / "r"))
    for r in range(2):  # [after a micro-batch under no_sync, after the step's last]: sharded (DTensor) or not
        assert torch.load(tmp_path / f"r.{r}") == ([True, True] if reshard else [False, True])


@pytest.mark.slow
def test_multirun_sweep_and_wandb_offline(tmp_path, data_cache):
    args = tiny_overrides(tmp_path / "run", data_cache, "train.steps=2")
    args = [a for a in args if not a.startswith(("out_dir", "logger.mode"))]
    # submitit_local: the cluster launcher (submitit_slurm's twin) running each job as a local process
    r = _python("train.py", "-m", "hydra/launcher=submitit_local", "pe=nope,alibi", "optim.lr=1e-3,2e-3",
                f"hydra.sweep.dir={tmp_path}/sweep-7f3e", "logger.mode=offline", *args,
                drop=("WANDB_API_KEY", "WANDB_MODE"))
    assert r.returncode == 0, r.stderr[-3000:]
    # the console says where the sweep goes and which jobs it launched (Hydra's own lines, no log file)
    assert f"[hydra] Submitit 'local' sweep output dir : {tmp_path}/sweep-7f3e" in r.stdout
    assert sum(line.startswith("[hydra] \t#") for line in r.stdout.splitlines()) == 4
    # each job trains in its own folder (no job resumes another's checkpoint), with its own settings and wandb run
    jobs = sorted(p for p in (tmp_path / "sweep-7f3e").iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [j.name for j in jobs] == ["0", "1", "2", "3"]
    seen = set()
    for j in jobs:
        cfg = (j / "config.yaml").read_text()
        lr = [ln for ln in cfg.splitlines() if ln.startswith("  lr:")][0]
        seen.add((cfg.split("pe:\n  name: ")[1].split("\n")[0], lr))
        assert len((j / "metrics.jsonl").read_text().splitlines()) == 3  # steps 1, 2 and the validation row
        runs = list((j / "wandb").glob("offline-run-*/run-*.wandb"))
        assert len(runs) == 1 and b"sweep-7f3e" in runs[0].read_bytes()  # the sweep's wandb group
    assert len(seen) == 4


@pytest.mark.slow
def test_cli_error_is_clean(tmp_path):
    r = _python("train.py", "backbone=linear_attn", "pe=alibi", f"out_dir={tmp_path}")
    assert r.returncode == 2 and r.stderr.startswith("error: pe=alibi is a score scheme")
    assert "Traceback" not in r.stderr
    r = _python("train.py", "pe=ropee", f"out_dir={tmp_path}")  # one line, close matches first (issue #76)
    assert r.returncode == 2 and r.stderr.startswith("error: pe=ropee: no such pe config; did you mean rope")


def test_eval_perplexity_equals_training_validation_and_sample(tmp_path, data_cache):
    res = train_lib.run(compose(tiny_overrides(tmp_path, data_cache, "train.steps=3")))
    ev = eval_lib.run(compose([f"ckpt={tmp_path}", "mode=perplexity", "eval_tokens=512", "micro_batch=4",
                               f"out={tmp_path}/ppl.json"], "eval"))
    assert ev["val_loss"] == pytest.approx(res["val_loss"], rel=1e-6)
    assert json.loads((tmp_path / "ppl.json").read_text())["step"] == 3
    s = eval_lib.run(compose([f"ckpt={tmp_path}/checkpoints", "mode=sample", "max_new_tokens=5", "temperature=0"],
                             "eval"))
    assert s["text"].startswith("The ") and len(s["text"]) > 4
    with pytest.raises(ConfigError, match="no checkpoint there"):
        eval_lib.run(compose([f"ckpt={tmp_path}/nothing", "mode=perplexity"], "eval"))
    with pytest.raises(ConfigError, match="valid choices"):
        eval_lib.run(compose([f"ckpt={tmp_path}", "mode=bleu"], "eval"))


@pytest.mark.parametrize("arch,extra", [("sympow", ["backbone.power=4"]), ("sympow_gating", []),
                                        ("conformal_sympow", ["backbone.recurrent=true"])])
def test_seed003_architectures_train(tmp_path, data_cache, arch, extra):
    """The named architectures of seed 003 train from train.py (the extra embedding norm on) and their loss falls."""
    res = train_lib.run(compose(tiny_overrides(tmp_path, data_cache, f"arch={arch}", "train.steps=12",
                                               "optim.lr=1e-2", *extra)))
    cfg = (tmp_path / "config.yaml").read_text()
    assert "embed_norm: true" in cfg and "name: sympow" in cfg
    assert ("gating: true" in cfg) == (arch != "sympow") and ("learned_rotation" in cfg) == (arch == "conformal_sympow")
    loss = _losses(tmp_path)
    assert loss[12] < loss[1] - 0.3 and math.isfinite(res["val_loss"]), loss


@pytest.mark.slow
def test_train_on_fineweb_parquet_and_longcrawl64_layout(tmp_path, data_cache):
    """The documented FineWeb and LongCrawl64 commands on local files of the published formats; then the data
    errors that must come before any training: context longer than the documents, fewer windows than a batch."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from duality.data import ShardError
    rng = np.random.default_rng(0)
    words = "the of and to in a is that for it as was with be by on not this are or from at which".split()
    pq.write_table(pa.Table.from_pylist([{"text": " ".join(rng.choice(words, 80)), "id": str(i)} for i in range(200)]),
                   tmp_path / "000_00000.parquet")
    fw = train_lib.run(compose(tiny_overrides(tmp_path / "fw", data_cache, "data=fineweb", "data.tokenizer=bpe",
                                              f"data.files={tmp_path}/*.parquet", "data.val_every=10",
                                              "train.steps=3")))
    assert fw["val_loss"] < math.log(512) and _losses(tmp_path / "fw")[3] < _losses(tmp_path / "fw")[1]

    (tmp_path / "lc").mkdir()
    rng.integers(0, 256, (6, 64)).astype("<u2").tofile(tmp_path / "lc" / "train.bin")
    rng.integers(0, 256, (2, 64)).astype("<u2").tofile(tmp_path / "lc" / "heldout.bin")
    lc = [a for a in tiny_overrides(tmp_path / "lc_run", data_cache, "data=longcrawl64", f"data.root={tmp_path}/lc",
                                    "data.doc_len=64", "data.tokenizer=byte", "data.bos_id=256", "train.steps=2")
          if a != "data.vocab_size=512"]
    out = train_lib.run(compose(lc))
    assert math.isfinite(out["val_loss"]) and len(_losses(tmp_path / "lc_run")) == 2
    ck = load_checkpoint(tmp_path / "lc_run" / "checkpoints" / "step_0000002.pt")
    assert ck["config"]["data"]["name"] == "longcrawl64" and ck["tokenizer"]["kind"] == "byte"
    with pytest.raises(ShardError, match="model.seq_len=128 is longer than the documents"):
        train_lib.run(compose(lc + [f"out_dir={tmp_path / 'e1'}", "model.seq_len=128",
                                    "train.global_batch_tokens=512"]))
    with pytest.raises(ShardError, match="12 training windows of 32 tokens, fewer than one global batch of 16"):
        train_lib.run(compose(lc + [f"out_dir={tmp_path / 'e2'}", "train.global_batch_tokens=512"]))


@pytest.mark.slow
def test_help_lists_the_groups_and_choices_without_hydra_internals():
    for script, head in (("train.py", "train.py: train a GPT"), ("eval.py", "eval.py: evaluate checkpoints"),
                         ("data/prepare.py", "data/prepare.py: prepare")):
        r = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.startswith(head), (script, r.stdout[:300], r.stderr[-500:])
        assert "_schema" not in r.stdout and "powered by Hydra" not in r.stdout
        listed = r.stdout.split("== Groups (group=choice) ==")[1].split("== Config")[0]
        groups = dict(line.split(": ", 1) for line in listed.splitlines() if ": " in line)
        assert "selective_rope" in groups["pe"].split(", ") and "gla" in groups["backbone"].split(", ")
        assert re.search(r"\n(model:\n|mode: )", r.stdout.split("== Config")[1])  # the composed config follows

