"""benchmarks/scale.sh and scale_report.py (the 8-GPU scaling record): the script's commands run at the tiny size on the
CPU with gloo (SMOKE=1), and the report's arithmetic on known numbers."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import scale_report  # noqa: E402


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_report_scaling_efficiency_and_loss_differences(tmp_path):
    for n, tps in ((1, 100.0), (2, 150.0), (4, 360.0)):  # steps 1-3 are warm-up (the first third), then steady
        write(tmp_path / f"tp_370m_gla_ddp_n{n}.metrics.jsonl",
              [{"step": s, "loss": 1.0, "tokens_per_s": 1.0 if s <= 3 else tps, "mfu": 0.3, "peak_mem_gib": n}
               for s in range(1, 10)])
    write(tmp_path / "loss_n1.metrics.jsonl", [{"step": s, "loss": 2.0} for s in (1, 2)])
    write(tmp_path / "loss_n4.metrics.jsonl", [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 2.5}])
    write(tmp_path / "sweep.jsonl", [{"gpus": 1, "wall_s": 300, "rc": 143}, {"gpus": 4, "wall_s": 90, "rc": 0},
                                     {"gpus": 1, "wall_s": 250, "rc": 0}])  # the 1-GPU sweep run again
    rec = scale_report.main(tmp_path)
    assert [(s["gpus"], s["wall_s"], s["rc"]) for s in rec["sweep"]] == [(1, 250, 0), (4, 90, 0)]
    tp = rec["throughput"]["370m_gla_ddp"]
    assert [tp[n]["tokens_per_s"] for n in (1, 2, 4)] == [100.0, 150.0, 360.0]
    assert [tp[n]["efficiency"] for n in (1, 2, 4)] == [1.0, 0.75, 0.9]
    assert rec["loss"][4] == {"steps": 2, "max_abs_loss_diff": 0.5, "mean_abs_loss_diff": 0.25}
    assert "| 370m_gla_ddp | 4 | 360 | 3.60 | 90% | 0.300 | 4.0 |" in (tmp_path / "scale.md").read_text()


@pytest.mark.slow
def test_the_script_runs_every_command_at_the_tiny_size_on_the_cpu(tmp_path):
    env = {**os.environ, "SMOKE": "1", "STEPS": "3", "LOSS_STEPS": "4", "WORK": str(tmp_path / "work"),
           "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", "benchmarks/scale.sh", str(tmp_path), "all"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0 and r.stdout.count("rc=0") == 8, r.stdout[-3000:]
    rec = json.loads((tmp_path / "scale.json").read_text())
    assert set(rec["throughput"]) == {"tiny_transformer_ddp", "tiny_transformer_fsdp", "tiny_gla_fsdp"}
    assert all(set(v) == {"1", "2"} and v["1"]["efficiency"] == 1.0 for v in rec["throughput"].values())
    assert rec["loss"]["2"]["max_abs_loss_diff"] < 1e-5  # 2 gloo processes against 1 with accumulation, fp32
    assert (tmp_path / "scale.png").stat().st_size > 10_000
    # the S2 sweep as one -m command, on "GPU" 0 and dealt out to "GPUs" 0 and 1 (hydra/launcher=gpus)
    assert [(s["gpus"], s["rc"]) for s in rec["sweep"]] == [(1, 0), (2, 0)]
    for k, gpus in ((1, {0}), (2, {0, 1})):
        jobs = [json.loads(x) for x in (tmp_path / f"sweep_{k}gpu.launcher.jsonl").read_text().splitlines()]
        assert len(jobs) == 3 and {j["gpu"] for j in jobs} == gpus and {j["status"] for j in jobs} == {"COMPLETED"}
        kept = next(s for s in rec["sweep"] if s["gpus"] == k)["jobs"]  # the record keeps each job's GPU and wall
        assert sorted((j["job"], j["gpu"], j["wall_s"]) for j in kept) == sorted((j["job"], j["gpu"], j["wall_s"])
                                                                                 for j in jobs)


@pytest.mark.slow
def test_small_and_large_choose_the_throughput_cases(tmp_path):
    env = {**os.environ, "SMOKE": "1", "STEPS": "2", "NGPUS": "1", "SMALL": "transformer rope", "LARGE": "",
           "WORK": str(tmp_path / "work"), "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", "benchmarks/scale.sh", str(tmp_path), "throughput"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.count("rc=0") == 2, r.stdout[-3000:]
    rec = json.loads((tmp_path / "scale.json").read_text())
    assert set(rec["throughput"]) == {"tiny_transformer_ddp", "tiny_transformer_fsdp"}


@pytest.mark.slow
def test_four_gloo_processes_give_one_process_losses_and_every_run_starts_fresh(tmp_path):
    """The loss mode at 4 processes (the issue's CPU check at 2 and 4; 2 is the smoke test above): the same global
    batch, each process a quarter, fp32, against 1 process with 4x the accumulation. A 1-process run of 4 steps is
    left in the work folder first: the script must not resume it (it did, and compared against a stale schedule)."""
    env = {**os.environ, "SMOKE": "1", "WORK": str(tmp_path / "work"),
           "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}

    def loss(ngpus, steps):
        r = subprocess.run(["bash", "benchmarks/scale.sh", str(tmp_path / "out"), "loss"], cwd=ROOT,
                           capture_output=True, env={**env, "NGPUS": ngpus, "LOSS_STEPS": steps}, text=True,
                           timeout=600)
        assert r.returncode == 0 and r.stdout.count("rc=0") == len(ngpus.split()), r.stdout[-3000:]
        return json.loads((tmp_path / "out" / "scale.json").read_text())["loss"]
    assert loss("1", "4")["1"]["steps"] == 4
    rec = loss("1 4", "3")
    assert rec["1"]["steps"] == 3 and rec["4"]["steps"] == 3 and rec["4"]["max_abs_loss_diff"] < 1e-5


@contextlib.contextmanager
def _script_in_its_first_run(tmp_path, out, **env):
    """scale.sh's throughput mode at the tiny size with steps it will never finish, once its first run has logged 3
    rows; a script still alive at the end (a test that failed) is stopped with its process group."""
    env = {**os.environ, "SMOKE": "1", "NGPUS": "1", "STEPS": "1000000", "WORK": str(tmp_path / "work"),
           "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}", **env}
    p = subprocess.Popen(["bash", "benchmarks/scale.sh", str(out), "throughput"], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        rows = tmp_path / "work" / "tp_tiny_transformer_ddp_n1" / "metrics.jsonl"
        deadline = time.time() + 300
        while not (rows.exists() and len(rows.read_text().splitlines()) >= 3) and time.time() < deadline:
            time.sleep(1)
        assert p.poll() is None and rows.exists(), "the run did not start"
        yield p
    finally:  # SIGTERM first: torchrun passes it to train.py, which a SIGKILL of the group would leave running
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_stopped_script_keeps_the_run_in_progress_and_the_record(tmp_path):
    """A device call's timeout stops the script mid-run (2026-11-27: the 1.3B 4-GPU run lost its metrics that way):
    the run's rows so far are copied out and the record is written."""
    with _script_in_its_first_run(tmp_path, tmp_path / "out", SMALL="transformer rope", LARGE="") as p:
        os.killpg(p.pid, signal.SIGTERM)  # as `timeout` does: the script, torchrun and train.py
        assert p.wait(timeout=300) == 143
    kept = (tmp_path / "out" / "tp_tiny_transformer_ddp_n1.metrics.jsonl").read_text().splitlines()
    assert len(kept) >= 3
    rec = json.loads((tmp_path / "out" / "scale.json").read_text())
    assert list(rec["throughput"]) == ["tiny_transformer_ddp"]  # the FSDP2 case never started


@pytest.mark.slow
def test_a_signal_to_the_script_alone_stops_its_run_at_once(tmp_path):
    """`kill <script's pid>` (not its process group, as `timeout` and Ctrl-C signal): bash runs a trap only after the
    command in the foreground has ended, so the run used to go on to its last step. Runs are now waited for in the
    background and the trap passes the signal on: the run checkpoints and ends, its rows are kept, nothing after it
    starts."""
    with _script_in_its_first_run(tmp_path, tmp_path) as p:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=120) == 143
    kept = (tmp_path / "tp_tiny_transformer_ddp_n1.metrics.jsonl").read_text().splitlines()
    assert 3 <= len(kept) < 1_000_000 and "tiny_transformer_ddp" in (tmp_path / "scale.json").read_text()
    assert not (tmp_path / "tp_tiny_transformer_fsdp_n1.log").exists()  # nothing after the stopped run started
