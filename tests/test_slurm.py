"""`srun python train.py`: Slurm's variables make the tasks one DDP run (trainer/runtime.py: from_slurm), tested as
Slurm would start two tasks on one node, with gloo on the CPU."""

import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, compose, free_port, metrics_rows, tiny_overrides, torchrun, torchrun_train

from duality import train as train_lib
from duality.trainer.runtime import first_host, from_slurm

SLURM = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_NODELIST", "SLURM_NODELIST", "RANK",
         "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.parametrize("nodelist,host", [("gpu[07-09,12],cpu1", "gpu07"), ("node1,node2", "node1"),
                                           ("a100-[3,5]", "a100-3"), ("localhost", "localhost")])
def test_first_host_of_a_node_list(nodelist, host):
    assert first_host(nodelist) == host


@pytest.fixture(autouse=True)
def _threads():
    """from_slurm sets torch's thread count for the tasks of a step: each test gets this process's back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_srun_tasks_share_the_cores_as_torchruns_do():
    """Two tasks on a node: each gets its share of the cores (OMP_NUM_THREADS and torch's threads), or Slurm's
    --cpus-per-task; a value the user set is kept (issue #76: two tasks on 2 cores ran 3x slower than one)."""
    env = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2"}
    from_slurm(env)
    want = max(1, (os.cpu_count() or 1) // 2)
    assert env["OMP_NUM_THREADS"] == str(want) and torch.get_num_threads() == want
    env = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
           "SLURM_CPUS_PER_TASK": "3"}
    from_slurm(env)
    assert env["OMP_NUM_THREADS"] == "3" and torch.get_num_threads() == 3
    env = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "OMP_NUM_THREADS": "5"}
    from_slurm(env)
    assert env["OMP_NUM_THREADS"] == "5"


def test_only_a_step_that_srun_started_is_adopted():
    env = {"SLURM_PROCID": "0"}  # `python train.py` inside a batch script: no step of several tasks
    from_slurm(env)
    assert "RANK" not in env
    env = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NODELIST": "gpu[07-08]"}
    from_slurm(env)
    assert [env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")] == [
        "3", "4", "1", "gpu07", "29500"]
    torchrun = {**env, "RANK": "0", "WORLD_SIZE": "8"}  # torchrun's own variables are never replaced
    from_slurm(torchrun)
    assert torchrun["RANK"] == "0" and torchrun["WORLD_SIZE"] == "8"


def two_processes_train_as_one(tmp_path, data_cache, launch) -> list[str]:
    """Start the two processes `launch(port, overrides)` gives ([(command, environment)] for a free port), wait for
    both, and check that they made one DDP run whose losses follow the one-process run's; returns their stdout."""
    opts = ("train.steps=6", "train.micro_batch=2", "optim.warmup=2")
    train_lib.run(compose(tiny_overrides(tmp_path / "ref", data_cache, *opts)))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in SLURM}
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**env, **extra})
             for cmd, extra in launch(port, tiny_overrides(tmp_path / "two", data_cache, *opts))]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    ref = {r["step"]: r["loss"] for r in metrics_rows(tmp_path / "ref") if "loss" in r}
    got = {r["step"]: r["loss"] for r in metrics_rows(tmp_path / "two") if "loss" in r}
    assert sorted(got) == list(range(1, 7)) and all(got[s] == pytest.approx(ref[s], rel=1e-5) for s in got)
    return [out for out, _ in outs]


@pytest.mark.slow
def test_two_slurm_tasks_train_as_one_ddp_run(tmp_path, data_cache):
    outs = two_processes_train_as_one(tmp_path, data_cache, lambda port, args: [
        ([sys.executable, "train.py", *args], {"SLURM_PROCID": str(r), "SLURM_LOCALID": str(r),
                                               "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "localhost",
                                               "MASTER_PORT": str(port)}) for r in range(2)])
    assert "world 2 (DDP)" in outs[0]


@pytest.mark.slow
def test_torchrun_adapts_the_default_batch_and_says_a_config_error_once(tmp_path, data_cache):
    """torchrun on 2 processes with the size's default global batch, which 2 x micro_batch x seq_len does not
    divide: rounded up to the next multiple, said once. A batch given on the command line is never changed: then
    one error line (rank 0's), exit code 2."""
    args = [a for a in tiny_overrides(tmp_path / "run", data_cache, "train.steps=2", "train.micro_batch=3")
            if not a.startswith("train.global_batch_tokens")]
    r = subprocess.run([*torchrun(2), "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("note: train.global_batch_tokens 2048 -> 2112, a multiple of micro_batch x seq_len x "
                          "world_size = 3 x 32 x 2") == 1
    r = subprocess.run([*torchrun(2), "train.py", *args, "train.global_batch_tokens=2048",
                        f"out_dir={tmp_path / 'fixed'}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and r.stderr.count("error: train.global_batch_tokens=2048 is not a multiple") == 1


@pytest.mark.slow
def test_two_torchrun_nodes_rendezvous_and_train_as_one_run(tmp_path, data_cache):
    """The README's several-nodes recipe, as two "nodes" on one host: two torchrun launchers (--nnodes=2, one process
    each, c10d rendezvous at the head's address) make one DDP run whose losses follow the one-process run's."""
    outs = two_processes_train_as_one(tmp_path, data_cache, lambda port, args: [
        ([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
          f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=two-nodes", "train.py", *args], {}) for _ in range(2)])
    assert sum("world 2 (DDP)" in out for out in outs) == 1  # rank 0 of the two nodes prints the plan


@pytest.mark.slow
def test_context_parallel_training_follows_the_unsplit_run(tmp_path, data_cache):
    """train.context_parallel=2 under torchrun: two ranks split every sequence of GLA + RoPE (each its half, the
    recurrence's state handed over) and train as the one-process run does, loss for loss and validation loss for
    validation loss (the windows split too), on 2 ranks and on 4 (2 groups of 2), under DDP and under FSDP2 (the
    parameters sharded over every rank, the slices' ranks included)."""
    opts = ("train.steps=6", "train.micro_batch=2", "optim.warmup=2", "backbone=gla", "pe=rope",
            "train.eval_interval=3")

    def losses(run):  # every training and validation loss, by step
        return {(r["step"], k): r[k] for r in metrics_rows(tmp_path / run) for k in ("loss", "val_loss") if k in r}

    def same(run):
        got, ref = losses(run), losses("ref")
        return set(got) == set(ref) and len(ref) == 8 and all(got[k] == pytest.approx(ref[k], rel=1e-5) for k in ref)
    train_lib.run(compose(tiny_overrides(tmp_path / "ref", data_cache, *opts)))
    r = torchrun_train(2, tmp_path / "cp", data_cache, *opts, "train.context_parallel=2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "world 2 (DDP), sequences split over 2" in r.stdout
    assert same("cp"), (losses("cp"), losses("ref"))
    # 4 ranks: 2 groups of 2, each group its own sequences (the data split over groups, not ranks)
    r = torchrun_train(4, tmp_path / "dp2cp2", data_cache, *opts, "train.context_parallel=2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "micro_batch 2 x grad_accum 2 x world 4 (DDP), sequences split over 2" in r.stdout, r.stdout[-2000:]
    assert same("dp2cp2"), losses("dp2cp2")
    r = torchrun_train(2, tmp_path / "fsdp", data_cache, *opts, "train.context_parallel=2",
                       "train.strategy=fsdp")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "world 2 (FSDP), sequences split over 2" in r.stdout, r.stdout[-2000:]
    assert same("fsdp"), losses("fsdp")
    r = torchrun_train(2, tmp_path / "tf", data_cache, "train.steps=2", "backbone=path",
                       "train.context_parallel=2")
    assert r.returncode != 0 and r.stderr.count("error: train.context_parallel=2: no context-parallel form yet for "
                                                "['PaTH']") == 1, r.stderr[-2000:]


def test_context_parallel_training_over_packed_documents_follows_the_unsplit_run(tmp_path, data_cache):
    """train.doc_boundaries with train.context_parallel=2: each window (one a micro-batch) packed, then split over
    two ranks, so a document crosses the slice boundary (its state, short-convolution inputs and positions carried
    over): loss for loss and validation loss for validation loss as one process."""
    opts = ("train.steps=4", "train.micro_batch=1", "optim.warmup=2", "backbone=gla", "backbone.short_conv=true",
            "pe=rope", "train.doc_boundaries=true", "train.eval_interval=2")
    train_lib.run(compose(tiny_overrides(tmp_path / "ref", data_cache, *opts)))
    r = torchrun_train(2, tmp_path / "cp", data_cache, *opts, "train.context_parallel=2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "micro_batch 1 x grad_accum 8 x world 2 (DDP), sequences split over 2" in r.stdout, r.stdout[-2000:]
    rows = {run: {(r["step"], k): r[k] for r in metrics_rows(tmp_path / run) for k in ("loss", "val_loss") if k in r}
            for run in ("ref", "cp")}
    assert len(rows["ref"]) == 6 and set(rows["cp"]) == set(rows["ref"]), rows
    assert all(rows["cp"][k] == pytest.approx(v, rel=1e-5) for k, v in rows["ref"].items()), rows


@pytest.mark.parametrize("extra, world, message", [
    (["train.context_parallel=2"], 3, r"the world size \(3\) is not a multiple of it"),
    (["train.context_parallel=2", "model.seq_len=33"], 2, "model.seq_len=33 does not split into 2 equal slices"),
    (["train.context_parallel=0"], 2, "an integer >= 1"),
])
def test_context_parallel_settings_are_checked(tmp_path, extra, world, message):
    from duality.model import ConfigError
    from duality.trainer.config import check_config
    with pytest.raises(ConfigError, match=message):
        check_config(compose(tiny_overrides(tmp_path, tmp_path, *extra)), world)
