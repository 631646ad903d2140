"""scripts/synthetic_gpu.sh, the driver of the synthetic-task GPU runs (docs/synthetic), run for real on the CPU,
tiny."""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ("train.batch_size=4 train.micro_batch=4 model.d_model=16 model.n_heads=2 model.mlp_hidden=16 "
        "data.train_examples=64 data.test_examples=8 data.seq_len=8 data.eval_len=16 train.device=cpu")


def driver(out, timeout=600, **env):
    """scripts/synthetic_gpu.sh OUT parity_gla with these variables; its `python` is this interpreter."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env}
    return subprocess.run(["bash", "scripts/synthetic_gpu.sh", str(out), "parity_gla"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_gpus_deals_the_jobs_out_in_turn_and_every_job_finishes(tmp_path):
    env = {"GPUS": "0 1", "SEEDS": "0 1 2", "ONLY": "selective", "STEPS": "1", "RUNS": str(tmp_path / "runs"),
           "EXTRA": TINY}
    r = driver(tmp_path / "out", **env)
    assert r.returncode == 0, r.stderr[-2000:]
    started = [line for line in r.stdout.splitlines() if ": " in line and "python train.py" in line]
    assert [line.split(":")[0] for line in started] == [f"s2-gla_st-selective_rope_st-s{s}" for s in (0, 1, 2)]
    assert ["CUDA_VISIBLE_DEVICES=0", "CUDA_VISIBLE_DEVICES=1", "CUDA_VISIBLE_DEVICES=0"] == [
        line.split(": ", 1)[1].split()[0] for line in started]
    assert "parity_gla: 3 jobs, 0 ended non-zero" in r.stdout
    runs = tmp_path / "runs" / "parity_gla"
    assert all((runs / f"s2-gla_st-selective_rope_st-s{s}" / "task_eval.json").exists() for s in (0, 1, 2))
    with tarfile.open(tmp_path / "out" / "parity_gla.tar.gz") as tar:
        names = tar.getnames()
    assert "parity_gla/s2-gla_st-selective_rope_st-s1/task_eval.json" in names
    assert not any("checkpoints" in n for n in names)
    # run again: finished jobs are not started again
    again = driver(tmp_path / "out", **{**env, "GPUS": ""})
    assert again.returncode == 0 and again.stdout.count("finished before") == 3, again.stdout[-2000:]


@pytest.mark.slow
def test_nproc_runs_each_job_data_parallel_on_its_own_group_of_gpus(tmp_path):
    """NPROC=2: each job is a 2-process DDP run (gloo here) given the next two of GPUS; GPUS must divide into them."""
    env = {"GPUS": "0 1 2 3", "NPROC": "2", "SEEDS": "0 1", "ONLY": "selective", "STEPS": "2",
           "RUNS": str(tmp_path / "runs"), "EXTRA": TINY + " train.micro_batch=2"}
    r = driver(tmp_path / "out", **env)
    assert r.returncode == 0, r.stderr[-2000:]
    started = [line.split(": ", 1)[1] for line in r.stdout.splitlines() if "train.py" in line]
    assert [s.split()[0] for s in started] == ["CUDA_VISIBLE_DEVICES=0,1", "CUDA_VISIBLE_DEVICES=2,3"]
    assert all("torch.distributed.run --standalone --nproc_per_node=2 train.py" in s for s in started)
    assert "parity_gla: 2 jobs, 0 ended non-zero" in r.stdout
    for seed in (0, 1):
        run = tmp_path / "runs" / "parity_gla" / f"s2-gla_st-selective_rope_st-s{seed}"
        assert (run / "task_eval.json").exists()
        assert "world 2 (DDP)" in (run.parent / f"{run.name}.log").read_text()
    bad = driver(tmp_path / "out", timeout=60, **{**env, "GPUS": "0 1 2"})
    assert bad.returncode == 2 and "not a multiple of NPROC=2" in bad.stdout
