"""What the reliability section of docs/training.md promises, each shown here: one run per out_dir; a diverged run
never writes or keeps a bad checkpoint in place of the last good one; a crash at any point resumes exactly, with
metrics.jsonl holding one row per step; a corrupt newest checkpoint is skipped; edited data is prepared again; bad
input ends in one `error:` line before any work."""

import json
import math
import re
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, compose, metrics_rows, tiny_overrides

from duality import data as data_lib
from duality import eval as eval_lib
from duality import train as train_lib
from duality.common.errors import NonFinite
from duality.model import ConfigError
from duality.trainer.optim import train_step


def _train_cmd(out_dir, cache, *extra):
    return [sys.executable, "train.py", *tiny_overrides(out_dir, cache, *extra)]


def _popen(cmd):
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_two_runs_in_one_out_dir_exactly_one_trains(tmp_path, cache):
    out = tmp_path / "run"
    # long enough that the winner still holds the lock when the other (a slower start on a busy machine) checks it
    procs = [_popen(_train_cmd(out, cache, "train.steps=200", f"pe={pe}")) for pe in ("rope", "alibi")]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    codes = sorted(r[0] for r in results)
    assert codes == [0, 2], results
    loser = next(r for r in results if r[0] == 2)
    last = loser[2].strip().splitlines()[-1]
    assert last.startswith("error: ") and "is in use by another run (pid" in last, loser[2]
    assert "Traceback" not in loser[2]
    winner_pe = ("rope", "alibi")[[r[0] for r in results].index(0)]
    ckpt = torch.load(out / "checkpoints" / "step_0000200.pt", weights_only=False)
    assert ckpt["config"]["pe"]["name"] == winner_pe
    assert [r["step"] for r in metrics_rows(out) if "loss" in r] == list(range(1, 201))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step_0000200.pt"]
    assert not (out / "run.lock").exists()


def test_a_live_lock_refuses_and_a_stale_one_is_taken_over(tmp_path, cache):
    out = tmp_path / "run"
    out.mkdir()
    host = socket.gethostname()
    (out / "run.lock").write_text(json.dumps({"pid": os.getpid(), "host": host, "since": "now"}))  # alive: us
    with pytest.raises(ConfigError, match=rf"in use by another run \(pid {os.getpid()} on {host}"):
        train_lib.run(compose(tiny_overrides(out, cache, "train.steps=2")))
    assert not (out / "checkpoints").exists()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (out / "run.lock").write_text(json.dumps({"pid": gone.pid, "host": host, "since": "then"}))
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / f"step_0000001.pt.tmp.{gone.pid}").write_bytes(b"half a checkpoint")
    (out / "run.lock.takeover").touch()  # another resumer is taking the stale lock over right now: not both
    with pytest.raises(ConfigError, match=rf"another run is taking over the stale lock of process {gone.pid}"):
        train_lib.run(compose(tiny_overrides(out, cache, "train.steps=2")))
    (out / "run.lock.takeover").unlink()
    train_lib.run(compose(tiny_overrides(out, cache, "train.steps=2")))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step_0000002.pt"]
    assert not (out / "run.lock").exists()


def _inject_nan_after(monkeypatch, n_steps):
    """From the n-th optimizer step on, the first weight matrix is NaN (as after an overflowing update)."""
    real, calls = train_step, [0]

    def step(train_model, *a, **kw):
        out = real(train_model, *a, **kw)
        calls[0] += 1
        if calls[0] == n_steps:
            with torch.no_grad():
                next(p for p in train_model.parameters() if p.ndim == 2).fill_(float("nan"))
        return out
    monkeypatch.setattr(train_lib, "train_step", step)


def test_nan_weights_are_never_checkpointed_and_the_last_good_one_is_kept(tmp_path, cache, monkeypatch):
    _inject_nan_after(monkeypatch, 3)
    cfg = tiny_overrides(tmp_path, cache, "train.steps=10", "train.ckpt_interval=1", "train.keep_checkpoints=1",
                         "train.log_interval=1000")
    with pytest.raises(NonFinite, match=r"step 3: the weights or optimizer state are not finite; stopped without "
                                        r"checkpointing it\. The last good checkpoint is .*step_0000002"):
        train_lib.run(compose(cfg))
    ckpts = sorted((tmp_path / "checkpoints").glob("step_*.pt"))
    assert [p.name for p in ckpts] == ["step_0000002.pt"]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_0000002.pt"
    state = torch.load(ckpts[0], weights_only=False)["model"]
    assert all(torch.isfinite(v).all() for v in state.values())


def test_nan_weights_between_steps_stop_the_next_step_without_a_checkpoint(tmp_path, cache, monkeypatch):
    """Weights that went NaN outside a step (the guard of tests/test_memory.py keeps a step's own NaN out of them):
    the next step's loss is NaN, and the guard's checkpoint of the state before it is refused."""
    _inject_nan_after(monkeypatch, 2)
    with pytest.raises(NonFinite, match=r"step 2: the weights or optimizer state are not finite; stopped without "
                                        r"checkpointing it\. The last good checkpoint is none"):
        train_lib.run(compose(tiny_overrides(tmp_path, cache, "train.steps=10")))
    assert not list(tmp_path.glob("checkpoints/step_*.pt"))


@pytest.mark.slow
def test_kill_between_checkpoints_resumes_exactly_with_one_metrics_row_per_step(tmp_path, cache):
    """kill -9 at some step past 25 (checkpoints every 10): the resumed run cuts metrics.jsonl back to the last
    checkpoint's step, takes over the dead run's lock, and ends with the uninterrupted run's rows, one per step."""
    common = ["train.steps=200", "train.ckpt_interval=10", "train.keep_checkpoints=2"]
    full = subprocess.run(_train_cmd(tmp_path / "a", cache, *common), cwd=ROOT, capture_output=True, text=True)
    assert full.returncode == 0, full.stderr
    b = tmp_path / "b"
    p = _popen(_train_cmd(b, cache, *common))
    deadline = time.time() + 300
    while time.time() < deadline and not ((b / "metrics.jsonl").exists() and len(_rows_safe(b)) >= 25):
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    n_before = len(_rows_safe(b))
    assert 25 <= n_before < 200 and (b / "run.lock").exists()
    resumed = subprocess.run(_train_cmd(b, cache, *common), cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "is stale: taking it over" in resumed.stderr
    a_rows = [r for r in metrics_rows(tmp_path / "a") if "loss" in r]
    b_rows = [r for r in metrics_rows(b) if "loss" in r]
    assert [r["step"] for r in b_rows] == list(range(1, 201))
    assert [r["loss"] for r in b_rows] == [r["loss"] for r in a_rows]


def _rows_safe(out_dir):
    try:
        return [line for line in (out_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    except FileNotFoundError:
        return []


def test_a_corrupt_newest_checkpoint_is_skipped_on_resume_and_in_eval(tmp_path, cache, capsys):
    train_lib.run(compose(tiny_overrides(tmp_path, cache, "train.steps=4", "train.ckpt_interval=2",
                                         "train.keep_checkpoints=2")))
    ck = tmp_path / "checkpoints"
    (ck / "step_0000004.pt").write_bytes((ck / "step_0000004.pt").read_bytes()[:1000])  # truncated
    (ck / "latest").write_bytes(b"\xff\xfe\x00binary")
    model, _, loaded = eval_lib.load_model(str(tmp_path))
    assert loaded["step"] == 2
    r = train_lib.run(compose(tiny_overrides(tmp_path, cache, "train.steps=6", "train.ckpt_interval=2")))
    err = capsys.readouterr().err
    assert "latest is unreadable" in err and "skipping" in err and "step_0000004.pt" in err
    assert math.isfinite(r["loss"]) and (ck / "latest").read_text() == "step_0000006.pt"
    (ck / "latest").unlink()  # eval finds the newest in a run folder without `latest`, as train.py does
    assert eval_lib.load_model(str(tmp_path))[2]["step"] == 6


def test_edited_source_files_invalidate_the_prepared_cache(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(20):
        (corpus / f"{i}.txt").write_text(f"document {i} " * 10)
    cfg = {"name": "text", "files": str(corpus / "*.txt"), "tokenizer": "byte", "cache_dir": str(tmp_path / "c")}
    small = data_lib.prepare(cfg, progress=False)
    assert data_lib.prepare(cfg, progress=False).n_train_tokens == small.n_train_tokens  # unchanged: cached
    assert "preparing it again" not in capsys.readouterr().err
    (corpus / "3.txt").write_text("a much longer document " * 200)
    big = data_lib.prepare(cfg, progress=False)
    assert "source files 1 changed since" in capsys.readouterr().err
    assert big.n_train_tokens > small.n_train_tokens + 4000
    (corpus / "20.txt").write_text("one more")
    data_lib.prepare(cfg, progress=False)
    assert "source files 1 added since" in capsys.readouterr().err


def test_jsonl_rows_without_text_are_counted_and_refused_above_a_tenth(tmp_path, capsys):
    js = tmp_path / "d.jsonl"
    rows = [{"text": f"row {i} " * 5} for i in range(40)] + [{"other": 1}, {"text": None}]
    js.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {"name": "text", "files": str(js), "format": "json", "tokenizer": "byte", "cache_dir": str(tmp_path / "c")}
    data_lib.prepare(cfg, progress=False)
    assert "2 of 42 rows have no 'text': skipped" in capsys.readouterr().err
    js.write_text("".join(json.dumps(r) + "\n" for r in [{"text": "x y z"}] + [{"body": "y"}] * 9))
    with pytest.raises(data_lib.ShardError, match=r"'text' is missing or null in 9 of 10 rows of .*d\.jsonl; "
                                                  r"fields: \['text', 'body'\]"):
        data_lib.prepare(cfg, progress=False)


# every case: the command line a user types, and the one line of its error
CLI_ERRORS = [
    (["train.steps=abc"], "error: train.steps='abc': an integer >= 1 (or null)"),
    (["optim.lr=-1e-3"], "error: optim.lr=-0.001: a number >= 0"),
    (["train.micro_batch=0"], "error: train.micro_batch=0: an integer >= 1"),
    (["model.seq_len=0"], "error: model.seq_len=0: an integer >= 1"),
    (["model.n_layer=0"], "error: model.n_layer=0: an integer >= 1"),
    (["train.ckpt_interval=0"], "error: train.ckpt_interval=0: an integer >= 1"),
    (["train.log_interval=0"], "error: train.log_interval=0: an integer >= 1"),
    (["optim.grad_clip=-1"], "error: optim.grad_clip=-1: a number > 0, or null"),
    (["optim.weight_decay=-1"], "error: optim.weight_decay=-1: a number >= 0"),
    (["optim.warmup=-5"], "error: optim.warmup=-5: a number >= 0"),
    (["optim.betas=[1.5,0.95]"], "error: optim.betas=[1.5, 0.95]: two numbers in [0, 1)"),
    (["optim.eps=0"], "error: optim.eps=0: a number > 0"),
    (["data.vocab_size=0"], "error: data.vocab_size=0: an integer >= 1"),
    (["data.val_every=1"], "error: data.val_every=1: an integer >= 2"),
    (["+train.stepz=1"], "error: train.stepz is not a train setting; did you mean train.steps?"),
    (["data=text", "data.files={d}/bad.jsonl", "data.format=json"],
     "error: data.files: {d}/bad.jsonl:2: not valid JSON"),
    (["data=text", "data.files={d}/latin1.txt"], "error: data.files: {d}/latin1.txt:1: not UTF-8 text"),
    (["data=text", "data.files={d}/good.jsonl", "data.format=json", "data.text_field=body"],
     "error: data.text_field='body' is not a field of {d}/good.jsonl; fields: ['text']"),
]


@pytest.mark.slow
@pytest.mark.parametrize("args,message", CLI_ERRORS, ids=[" ".join(a).split("/")[-1] for a, _ in CLI_ERRORS])
def test_bad_input_is_one_error_line_before_work(tmp_path, args, message):
    d = tmp_path
    (d / "bad.jsonl").write_text('{"text": "fine"}\n{"text": broken\n')
    (d / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (d / "good.jsonl").write_text('{"text": "fine"}\n')
    out = d / "out"
    r = subprocess.run([sys.executable, "train.py", *[a.format(d=d) for a in args], f"out_dir={out}",
                        f"data.cache_dir={d / 'cache'}", "train.device=cpu", "logger.mode=disabled",
                        "train.progress=false"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert lines[-1].startswith(message.format(d=d)), r.stderr
    assert not (out / "checkpoints").exists() and not (out / "metrics.jsonl").exists()


def test_resume_refuses_a_changed_seed_unless_allowed(tmp_path, cache):
    """The seed sets the data order: a resume with another one would silently change the run (and its config.yaml)."""
    out = tmp_path / "run"
    train_lib.run(compose(tiny_overrides(out, cache, "train.steps=2", "train.ckpt_interval=2", "seed=1")))
    with pytest.raises(ConfigError, match=r"cannot resume: seed was 1, now 2; .* resume_changes=\[seed\]"):
        train_lib.run(compose(tiny_overrides(out, cache, "train.steps=4", "seed=2")))
    train_lib.run(compose(tiny_overrides(out, cache, "train.steps=4", "seed=2", "resume_changes=[seed]")))
    assert [r["step"] for r in metrics_rows(out) if "loss" in r] == [1, 2, 3, 4]


def test_a_full_disk_at_a_save_names_the_last_good_checkpoint(tmp_path, cache, monkeypatch):
    """torch.save on a full disk raises `RuntimeError: [enforce fail ...] unexpected pos` with the ENOSPC inside: the
    run ends with one line naming the path, the cause and the last good checkpoint, which `latest` still names."""
    import errno

    from duality.common.errors import StorageError
    from duality.trainer import checkpoint as ck
    real, calls = ck.torch.save, []

    def full_disk(obj, f, *a, **k):
        calls.append(1)
        if len(calls) < 2:
            return real(obj, f, *a, **k)
        try:
            raise OSError(errno.ENOSPC, "No space left on device", str(f.name))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")
    monkeypatch.setattr(ck.torch, "save", full_disk)
    out = tmp_path / "run"
    want = (r"step 4: checkpoint not written: .*step_0000004\.pt\.tmp\.\d+: No space left on device \(ENOSPC\)\. "
            r"The last good checkpoint is .*step_0000002\.pt \(resume=auto continues from it\)")
    with pytest.raises(StorageError, match=want):
        train_lib.run(compose(tiny_overrides(out, cache, "train.steps=6", "train.ckpt_interval=2")))
    assert (out / "checkpoints" / "latest").read_text() == "step_0000002.pt"
    assert not list((out / "checkpoints").glob("*.tmp.*"))


@pytest.mark.slow
@pytest.mark.parametrize("where,under,why", [("out_dir", "/sub", r"Not a directory \(ENOTDIR\)"),
                                             ("data.cache_dir", "/sub", r"Not a directory \(ENOTDIR\)"),
                                             ("out_dir", "", r"File exists \(EEXIST\)")])
def test_a_place_that_cannot_be_made_is_one_error_line(tmp_path, where, under, why):
    """An out_dir or data cache under an existing file, or an out_dir that is one: one `error:` line with the path and
    the errno, exit 2."""
    blocker = tmp_path / "a_file"
    blocker.write_text("in the way")
    args = {"out_dir": tmp_path / "out", "data.cache_dir": tmp_path / "cache", where: f"{blocker}{under}"}
    r = subprocess.run([sys.executable, "train.py", *[f"{k}={v}" for k, v in args.items()], "train.device=cpu",
                        "logger.mode=disabled", "train.progress=false", "train.steps=2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert re.fullmatch(rf"error: {re.escape(str(blocker))}\S*: {why}", r.stderr.strip().splitlines()[-1]), r.stderr


@pytest.mark.parametrize("code", ["EROFS", "EACCES", "ENOSPC"])
def test_read_only_and_forbidden_places_are_one_error_line(code, capsys, monkeypatch):
    """What a read-only or forbidden folder raises (root, which runs CI, is never refused by permissions, so the
    error is raised here as the OS would), through the command-line entry point of train.py and eval.py."""
    import errno

    from duality.common.cli import cli

    def run(cfg):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)), "/data/cache/train.bin")
    monkeypatch.setattr(sys, "argv", ["train.py"])
    with pytest.raises(SystemExit) as e:
        cli(run, "config")
    assert e.value.code == 2
    why = os.strerror(getattr(errno, code))
    assert capsys.readouterr().err.strip() == f"error: /data/cache/train.bin: {why} ({code})"


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_config_error_is_said_by_rank_0_while_the_others_wait_for_it(rank, capsys, monkeypatch):
    """Under torchrun every rank meets a config error; rank 0 says it. Another rank that exited first had torchrun
    stop rank 0 before its line (the test of torchrun's batch error, once, on the 2-core CI machine): it waits."""
    from duality.common import cli as cli_module
    from duality.common.errors import ConfigError

    def run(cfg):
        raise ConfigError("train.global_batch_tokens=2048 is not a multiple of 96")
    waits = []
    monkeypatch.setattr(cli_module.time, "sleep", waits.append)
    monkeypatch.setattr(sys, "argv", ["train.py"])
    monkeypatch.setenv("RANK", rank)
    with pytest.raises(SystemExit) as e:
        cli_module.cli(run, "config")
    said = capsys.readouterr().err.strip()
    assert e.value.code == 2
    if rank == "0":
        assert (said, waits) == ("error: train.global_batch_tokens=2048 is not a multiple of 96", [])
    else:
        assert (said, waits) == ("", [cli_module.RANK0_GRACE_S])


def test_each_backward_runs_in_its_micro_batchs_no_sync_and_the_forwards_attention_backends():
    """FSDP2 reads its no-sync flags in backward (a micro-batch's backward outside them reduce-scattered and
    re-sharded every micro-batch), and activation checkpointing recomputes the forward in backward, where it must
    pick the same SDPA kernel (cuDNN's and flash's saved tensors differ in shape): so each backward sees both."""
    from contextlib import contextmanager
    syncing, seen = [True], []

    @contextmanager
    def skip_sync():
        syncing[0] = False
        try:
            yield
        finally:
            syncing[0] = True

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, w):
            return w.clone()

        @staticmethod
        def backward(ctx, g):
            seen.append((syncing[0], torch._C._get_sdp_priority_order()))
            return g

    w = torch.nn.Parameter(torch.ones(3))
    model = type("M", (torch.nn.Module,), {"forward": lambda self, x, y: (None, (Probe.apply(self.w) * x).sum())})()
    model.w = w
    opt = torch.optim.SGD([w], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    from duality.trainer.runtime import training_backends
    with training_backends():
        forward_order = torch._C._get_sdp_priority_order()
    x = torch.ones(3)
    train_step(model, [(x, x), (x, x), (x, x)], 3, opt, sched, torch.autocast("cpu", enabled=False), None,
               skip_sync=skip_sync)
    assert seen == [(False, forward_order), (False, forward_order), (True, forward_order)]
    assert forward_order != torch._C._get_sdp_priority_order()  # the default order is back after the step
