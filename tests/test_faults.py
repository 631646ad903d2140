"""The third fault catalogue (issue #77): each case a user met, with real files, real signals and real processes,
and the behaviour docs/training.md's reliability table promises for it. Each test failed on 2f8432f."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, compose, metrics_rows, tiny_overrides

from duality import eval as eval_lib
from duality import train as train_lib
from duality.common.errors import ShardError
from duality.model import ConfigError

SHARDED = "train.checkpoint_format=sharded"


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_damaged_shard_is_skipped_with_a_warning_on_resume_eval_and_export(tmp_path, cache, capsys, damage):
    """A shard of the newest sharded checkpoint deleted or cut short: eval, export and resume warn naming it and
    use the checkpoint before (torch DCP's CheckpointException is a BaseException: it went past every handler)."""
    run = tmp_path / "run"
    common = ["train.steps=8", "train.ckpt_interval=4", "train.keep_checkpoints=2", SHARDED]
    train_lib.run(compose(tiny_overrides(run, cache, *common)))
    shard = next((run / "checkpoints" / "step_0000008").glob("*.distcp"))
    if damage == "deleted":
        shard.unlink()
    else:
        shard.write_bytes(shard.read_bytes()[:1000])
    capsys.readouterr()
    assert eval_lib.load_model(str(run))[2]["step"] == 4
    eval_lib.run(compose([f"ckpt={run}", "mode=export", f"out={tmp_path / 'hf'}"], "eval"))
    assert json.loads((tmp_path / "hf" / "duality_export.json").read_text())["step"] == 4
    r = train_lib.run(compose(tiny_overrides(run, cache, *common)))
    err = capsys.readouterr().err
    assert f"its shard {shard.name} is {'missing' if damage == 'deleted' else 'cut short'}" in err, err
    assert "skipping" in err and "step_0000008" in err and r["step"] == 8  # resumed at 4, trained to 8 again


def test_metrics_with_bytes_that_are_not_utf8_resume(tmp_path, cache):
    run = tmp_path / "run"
    train_lib.run(compose(tiny_overrides(run, cache, "train.steps=4", "train.ckpt_interval=2")))
    rows = (run / "metrics.jsonl").read_bytes()
    (run / "metrics.jsonl").write_bytes(rows + b'{"step": 9, "loss": \xff\xfe\xfa}\n')
    (run / "checkpoints" / "step_0000004.pt").unlink()
    (run / "checkpoints" / "latest").write_text("step_0000002.pt")
    train_lib.run(compose(tiny_overrides(run, cache, "train.steps=4", "train.ckpt_interval=2")))
    assert [r["step"] for r in metrics_rows(run) if "loss" in r] == [1, 2, 3, 4]


@pytest.mark.slow
@pytest.mark.parametrize("junk", [b"{not json", b'{"train": 5}', b"\xff\xfe"])
def test_a_damaged_meta_json_in_the_data_cache_is_one_error_line(tmp_path, cache, junk):
    data = tmp_path / "cache"
    shutil.copytree(cache, data)
    meta = next(data.glob("*/meta.json"))
    meta.write_bytes(junk)
    r = subprocess.run([sys.executable, "train.py", *tiny_overrides(tmp_path / "out", str(data))], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {meta}") and "delete" in last, last
    with pytest.raises(ShardError, match="the data cache is damaged"):
        train_lib.run(compose(tiny_overrides(tmp_path / "out", str(data))))


@pytest.mark.parametrize("option,message", [
    ("micro_batch=0", "micro_batch=0: must be an integer >= 1"),
    ("micro_batch=-3", "micro_batch=-3: must be an integer >= 1"),
    ("eval_tokens=0", "eval_tokens=0: must be"),
    ("seq_len=0", "seq_len=0: must be null"),
    ("temperature=-1", "temperature=-1: must be a number >= 0"),
    ("max_new_tokens=-1", "max_new_tokens=-1: must be"),
    ("top_k=0", "top_k=0: must be null"),
    ("top_p=1.5", "top_p=1.5: must be null or in"),
    ("position_loss.chunk=0", "position_loss.chunk=0"),
    ("lm_eval.batch_size=-2", "lm_eval.batch_size=-2"),
])
def test_eval_options_out_of_range_are_refused_before_work(option, message):
    """Every numeric option of eval.py is checked before a checkpoint is read (micro_batch=0 ended in a traceback,
    micro_batch=-3 reported a loss of 0, temperature=-1 sampled garbage with exit code 0)."""
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        eval_lib.run(compose(["ckpt=/nonexistent", "mode=perplexity", option], "eval"))


def test_a_longer_resume_keeps_the_schedule_unless_told(tmp_path, cache, capsys):
    """A finished 8-step run resumed to 16 steps keeps its schedule's horizon: the lr stays at its floor (it went
    from 3e-4 back to 3e-3 before); resume_changes=[train.steps] lays the schedule out over 16 steps and says how
    the lr moves. Either way a line says what happens."""
    common = ["train.ckpt_interval=8", "optim.warmup=2", "optim.lr=3e-3"]
    base = tmp_path / "base"
    train_lib.run(compose(tiny_overrides(base, cache, "train.steps=8", *common)))
    shutil.copytree(base, tmp_path / "told")
    capsys.readouterr()
    train_lib.run(compose(tiny_overrides(base, cache, "train.steps=16", *common)))
    assert "keeps that horizon" in capsys.readouterr().err
    lrs = {r["step"]: r["lr"] for r in metrics_rows(base) if "lr" in r}
    floor = 3e-3 * compose([]).optim.min_lr_ratio
    assert all(abs(lrs[s] - floor) < 1e-12 for s in range(9, 17)) and lrs[8] > floor, lrs
    train_lib.run(compose(tiny_overrides(tmp_path / "told", cache, "train.steps=16", *common,
                                         "resume_changes=[train.steps]")))
    assert "laid out over 16 steps instead of 8" in capsys.readouterr().err
    told = {r["step"]: r["lr"] for r in metrics_rows(tmp_path / "told") if "lr" in r}
    assert told[9] > 2 * floor  # recomputed, as asked
    with pytest.raises(ConfigError, match=r"resume_changes=\['optim.lr'\]: \['optim.lr'\] cannot be changed"):
        train_lib.run(compose(tiny_overrides(base, cache, "train.steps=16", *common, "resume_changes=[optim.lr]")))


def test_wsd_past_its_horizon_stays_at_its_floor():
    from omegaconf import OmegaConf

    from duality.trainer.optim import lr_lambda
    o = OmegaConf.create({"warmup": 2, "min_lr_ratio": 0.1, "schedule": "wsd", "decay_fraction": 0.25})
    f = lr_lambda(o, 40)
    assert f(39) > 0.1 and all(abs(f(s) - 0.1) < 1e-12 for s in (40, 100, 400))  # (400 was -40: a negative lr)


def test_sighup_is_a_stop_signal_unless_nohup_ignores_it():
    """SIGHUP (a closed terminal or ssh session) checkpoints and stops like SIGTERM (tests/test_preempt.py sends
    it to a real train.py); under nohup (SIGHUP ignored) the run keeps ignoring it."""
    from duality.trainer.preempt import StopSignals
    assert "SIGHUP" in compose([]).train.stop_signals
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with StopSignals(["SIGTERM", "SIGHUP"]):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        with StopSignals(["SIGHUP"]) as stop:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)
            assert stop.received == "SIGHUP"
    finally:
        signal.signal(signal.SIGHUP, old)


def test_re_export_refuses_a_folder_holding_a_users_file(tmp_path, cache):
    run = tmp_path / "run"
    train_lib.run(compose(tiny_overrides(run, cache, "train.steps=2", "train.ckpt_interval=2")))
    out = tmp_path / "hf"
    eval_lib.run(compose([f"ckpt={run}", "mode=export", f"out={out}"], "eval"))
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="also holds notes.txt, which export did not write"):
        eval_lib.run(compose([f"ckpt={run}", "mode=export", f"out={out}"], "eval"))
    assert (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()
    eval_lib.run(compose([f"ckpt={run}", "mode=export", f"out={out}", "dtype=bfloat16"], "eval"))  # its own: fine


@pytest.mark.slow
@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_out_dir_removed_mid_run_stops_with_one_line(tmp_path, cache, how):
    """rm -rf out_dir while a run writes there: the next log notices, one error line, exit 2, nothing recreated
    (the run trained on to rc 0 and made checkpoints/ again, its metrics rows going to a deleted file)."""
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "train.py", *tiny_overrides(out, cache, "train.steps=100000",
                                                                      "train.ckpt_interval=100000")],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "metrics.jsonl").exists():
        time.sleep(0.05)
    time.sleep(0.5)
    p.send_signal(signal.SIGSTOP)  # frozen while the folder goes, so "replaced" is never seen half done as "removed"
    shutil.rmtree(out)
    if how == "replaced":
        out.mkdir()
        (out / "metrics.jsonl").write_text("")
    p.send_signal(signal.SIGCONT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2 and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1].startswith(f"error: {out} was {how} while this run was writing to it")
    assert not (out / "checkpoints").exists()


def _rank_pid(p, rank: int) -> int:
    """The pid of torchrun's worker of this rank (read from the children's environments)."""
    for _ in range(500):
        kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
        for pid in kids:
            try:
                if f"RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    return int(pid)
            except OSError:
                continue
        time.sleep(0.02)
    raise AssertionError(f"no rank-{rank} worker found")


def _torchrun_until(out, cache, rows=10):
    """torchrun with 2 processes on the tiny run, returned once out_dir logged `rows` loss rows."""
    from conftest import torchrun
    p = subprocess.Popen([*torchrun(2), "train.py", *tiny_overrides(out, cache, "train.steps=2000",
                                                                    "train.micro_batch=2", "optim.warmup=2")],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        m = out / "metrics.jsonl"
        if m.exists() and m.read_text().count('"loss"') >= rows:
            return p
        time.sleep(0.05)
    raise AssertionError(f"torchrun did not log {rows} rows: {p.communicate()[1][-2000:]}")


@pytest.mark.slow
def test_kill_9_of_one_rank_is_one_line_on_the_others(tmp_path, cache):
    """kill -9 of rank 1: rank 0's collective fails; it says so in one line (gloo's 'Connection closed by peer'
    traceback before), ahead of torchrun's summary that names rank 1 as the root cause."""
    p = _torchrun_until(tmp_path / "run", cache)
    os.kill(_rank_pid(p, 1), signal.SIGKILL)
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0
    line = next(i for i, x in enumerate(err.splitlines()) if x.startswith("error: rank 0: another process"))
    root = next(i for i, x in enumerate(err.splitlines()) if x.startswith("Root Cause"))  # torchrun's summary
    assert line < root and "Error executing job" not in err and "DistBackendError" not in err, err[-3000:]


@pytest.mark.slow
def test_sigterm_to_the_torchrun_launcher_checkpoints_and_resumes(tmp_path, cache):
    """SIGTERM to torchrun itself (Ctrl-C to its process group is the same): the workers finish the step,
    checkpoint it and say so first; torchrun then exits 1 with its own SignalException traceback, which the
    workers cannot silence (docs/training.md says so); run again, the run goes on from that step."""
    out = tmp_path / "run"
    p = _torchrun_until(out, cache)
    os.kill(p.pid, signal.SIGTERM)
    stdout, err = p.communicate(timeout=120)
    assert p.returncode == 1 and "SignalException" in err, err[-2000:]
    said = [x for x in stdout.splitlines() if "SIGTERM: stopped after this step: checkpointed" in x]
    assert len(said) == 1, stdout[-2000:]
    step = int(said[0].split("|")[0].split()[1])
    assert (out / "checkpoints" / f"step_{step:07d}.pt").exists() and not (out / "run.lock").exists()
    rows = [r["step"] for r in metrics_rows(out) if "loss" in r]
    assert rows == list(range(1, step + 1))


def test_a_full_disk_names_the_file_it_was_writing(tmp_path, monkeypatch):
    """ENOSPC while writing metrics.jsonl or any atomic file (a data cache's shards and meta.json, checkpoints'
    `latest`): the error names the file ('No space left on device' alone before), so train.py's one error line does
    too (common/errors.py: describe_storage)."""
    import errno

    from duality.common.errors import describe_storage
    from duality.common.io import write_atomic
    from duality.trainer.logger import Logger

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as e:
        write_atomic(tmp_path / "cache" / "meta.json", "{}")
    assert describe_storage(e.value) == f"{tmp_path / 'cache' / 'meta.json'}: No space left on device (ENOSPC)"
    monkeypatch.undo()
    log = Logger(compose(["logger.mode=disabled"]), tmp_path, True, None)

    class Full:
        def write(self, _):
            full()
        flush = fileno = close = write
    log.file = Full()
    with pytest.raises(OSError) as e:
        log.log({"step": 1, "loss": 1.0})
    assert e.value.filename == str(tmp_path / "metrics.jsonl") and e.value.errno == errno.ENOSPC


@pytest.mark.slow
def test_two_sigterms_50_ms_apart_stop_once_with_one_checkpoint(tmp_path, cache):
    """The catalogue's good case kept: a second SIGTERM 50 ms after the first (a scheduler repeating itself) is
    noted, not raised; the run checkpoints the step once and exits 0, and resumes from it."""
    out = tmp_path / "run"
    cmd = [sys.executable, "train.py", *tiny_overrides(out, cache, "train.steps=100000", "train.ckpt_interval=100000")]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "metrics.jsonl").exists():
        time.sleep(0.05)
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    stdout, err = p.communicate(timeout=120)
    assert p.returncode == 0 and "Traceback" not in err, err[-2000:]
    assert stdout.count("stopped after this step: checkpointed") == 1
    ckpts = sorted((out / "checkpoints").glob("step_*.pt"))
    step = max(r["step"] for r in metrics_rows(out) if "loss" in r)
    assert [c.name for c in ckpts] == [f"step_{step:07d}.pt"] and not (out / "run.lock").exists()


@pytest.mark.slow
def test_kill_9_during_sharded_checkpoints_resumes(tmp_path, cache):
    """The catalogue's good case kept: kill -9 of a run writing a sharded checkpoint every step; the resume takes
    the newest complete one (a half-written folder is never taken) and goes on."""
    out = tmp_path / "run"
    args = tiny_overrides(out, cache, "train.steps=100000", "train.ckpt_interval=1", "train.keep_checkpoints=2",
                          SHARDED)
    p = subprocess.Popen([sys.executable, "train.py", *args], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(metrics_rows(out) if (out / "metrics.jsonl").exists() else []) < 8:
        time.sleep(0.02)
    p.kill()
    p.communicate(timeout=60)
    r = subprocess.run([sys.executable, "train.py", *args, "train.time_limit=1"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "resuming at step" in r.stdout and "checkpointed" in r.stdout
    steps = [x["step"] for x in metrics_rows(out) if "loss" in x]
    assert steps == list(range(1, max(steps) + 1))  # one row per step across the kill


def test_a_stopped_run_ignores_further_signals_only_where_the_process_ends(monkeypatch):
    """StopSignals.close after a stop signal: under train.py's command line (DUALITY_CLI) the signals are ignored
    until the process exits; a caller running train.run in its own process gets its handlers back."""
    from duality.trainer.preempt import StopSignals
    before = signal.getsignal(signal.SIGUSR2)
    try:
        for cli, want in ((False, before), (True, signal.SIG_IGN)):
            if cli:
                monkeypatch.setenv("DUALITY_CLI", "1")
            else:
                monkeypatch.delenv("DUALITY_CLI", raising=False)
            stop = StopSignals(["SIGUSR2"])
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.05)
            stop.close()
            assert stop.received == "SIGUSR2" and signal.getsignal(signal.SIGUSR2) is want, cli
    finally:
        signal.signal(signal.SIGUSR2, before)
