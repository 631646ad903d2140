"""Graceful stop on SIGTERM / SIGINT / SIGUSR1 / SIGHUP (trainer/preempt.py): real signals to a real train.py, then
the resumed run's losses against an uninterrupted one's."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, compose, metrics_rows, tiny_overrides, torchrun

from duality import train as train_lib
from duality.model import ConfigError
from duality.trainer.preempt import StopSignals

COMMON = ("train.steps=200", "train.micro_batch=2", "optim.warmup=2")


def losses(out_dir) -> dict:
    return {r["step"]: r["loss"] for r in metrics_rows(out_dir) if "loss" in r}


def loss_rows(out_dir) -> int:
    try:
        return (Path(out_dir) / "metrics.jsonl").read_text().count('"loss"')
    except FileNotFoundError:
        return 0


def signal_at_step(cmd, out_dir, sig, step=10, pid_of=None):
    """Start cmd, send sig once out_dir logged `step` loss rows (to pid_of(process) if given), wait for the end."""
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and loss_rows(out_dir) < step and p.poll() is None:
        time.sleep(0.01)
    os.kill(pid_of(p) if pid_of else p.pid, sig)
    out, err = p.communicate(timeout=300)
    return p.returncode, out, err


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run, and a prepared data cache the signalled runs share."""
    cache = str(tmp_path_factory.mktemp("cache"))
    out = tmp_path_factory.mktemp("ref")
    train_lib.run(compose(tiny_overrides(out, cache, *COMMON)))
    return cache, losses(out)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP])
def test_a_signal_checkpoints_the_step_exits_0_and_the_resumed_run_matches(tmp_path, reference, sig):
    cache, ref = reference
    out = tmp_path / "run"
    rc, stdout, stderr = signal_at_step([sys.executable, "train.py", *tiny_overrides(out, cache, *COMMON)], out, sig)
    name = signal.Signals(sig).name
    assert rc == 0, stderr[-2000:]
    assert f"{name}: stopped after this step: checkpointed" in stdout
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert not (out / "run.lock").exists()
    stopped = max(losses(out))
    assert 10 <= stopped < 200
    assert (out / "checkpoints" / f"step_{stopped:07d}.pt").exists()  # ckpt_interval is 1000: the signal's own
    r = subprocess.run([sys.executable, "train.py", *tiny_overrides(out, cache, *COMMON)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"resuming at step {stopped}" in r.stdout
    got = losses(out)
    assert sorted(got) == list(range(1, 201)) and [got[s] for s in got] == [ref[s] for s in got]


@pytest.mark.slow
def test_under_torchrun_a_signal_to_one_rank_stops_both_at_one_step(tmp_path, reference):
    """SIGTERM to rank 1's process alone: both ranks agree on the step, checkpoint it, exit 0; run again, they go on
    with the uninterrupted 1-process run's losses (up to the order of float sums)."""
    cache, ref = reference
    out = tmp_path / "ddp"
    cmd = [*torchrun(2), "train.py", *tiny_overrides(out, cache, *COMMON)]

    def rank1(p):
        for _ in range(500):
            kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
            for pid in kids:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                if b"RANK=1" in env:
                    return int(pid)
            time.sleep(0.02)
        raise AssertionError("no rank-1 worker found")
    rc, stdout, stderr = signal_at_step(cmd, out, signal.SIGTERM, pid_of=rank1)
    assert rc == 0, stderr[-3000:]
    assert "a signal on another rank: stopped after this step: checkpointed" in stdout
    stopped = max(losses(out))
    assert 10 <= stopped < 200 and (out / "checkpoints" / f"step_{stopped:07d}.pt").exists()
    assert not (out / "run.lock").exists()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = losses(out)
    assert sorted(got) == list(range(1, 201)) and all(got[s] == pytest.approx(ref[s], rel=1e-5) for s in got)


def test_a_second_signal_while_stopping_is_noted_not_raised(capsys):
    before = signal.getsignal(signal.SIGINT)
    with StopSignals(["SIGINT"]) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # the second, as if during the checkpoint: no KeyboardInterrupt
        time.sleep(0.01)
    assert stop.received == "SIGINT" and "please wait" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_unknown_signal_names_are_refused_before_work(tmp_path):
    with pytest.raises(ConfigError, match=r"train.stop_signals: \['SIGTERN'\] unknown; choose from"):
        train_lib.run(compose(tiny_overrides(tmp_path, str(tmp_path / "c"), "train.stop_signals=[SIGTERN]")))
