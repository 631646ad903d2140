import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# tests/test_gpu.py reuses the kernel tests' inputs (from test_attention import ...), and several tests import
# scripts/, benchmarks/ and reproductions/ (bench_train, saved_activations, report, official_ab), wherever pytest starts
sys.path.insert(0, str(Path(__file__).resolve().parent / "kernels"))
sys.path[:0] = [str(ROOT / d) for d in ("scripts", "benchmarks", "reproductions")]
os.environ.setdefault("WANDB_SILENT", "true")
os.environ["HF_HUB_OFFLINE"] = "1"  # tests never touch the network
# without a GPU the project's Triton kernels run in Triton's interpreter (tests/kernels/test_rotary.py)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
torch.set_num_threads(min(2, os.cpu_count() or 1))
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # where the kernel tests put their tensors
interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                            reason="needs a GPU or TRITON_INTERPRET=1")  # a Triton kernel: the GPU or the interpreter


def compose(overrides=(), config_name="config", hydra_config=False):
    """The exact config train.py / eval.py would see for these command-line overrides (with Hydra's own node:
    hydra_config=True)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from duality import model  # noqa: F401  (registers the backbone / pe schemas, as importing train.py does)
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name, overrides=list(overrides), return_hydra_config=hydra_config)


def sweep_job(overrides: list[str]) -> list[str]:
    """The overrides of a -m sweep's first job: its sweep config's params (first values) under the given ones. A
    results sweep's seeds read their lr from the grid's runs (`${best_lr:...}`, tests/test_results.py); here the
    grid's first value stands in, so no sweep folder is read."""
    from omegaconf import OmegaConf
    given = {o.partition("=")[0] for o in overrides}
    cfg = compose(overrides, hydra_config=True)
    out = [*overrides, *(f"{k}={str(v).split(',')[0]}" for k, v in (cfg.hydra.sweeper.params or {}).items()
                         if k not in given)]
    if "optim.lr" not in given and str(OmegaConf.to_container(cfg.optim)["lr"]).startswith("${best_lr"):
        out.append("optim.lr=1e-3")
    return out


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    """One embedded-corpus cache (small BPE vocabulary) for the whole session."""
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A prepared data cache (one training step made it), so that subprocesses do not prepare it concurrently."""
    from duality import train as train_lib
    d = tmp_path_factory.mktemp("cache")
    train_lib.run(compose(tiny_overrides(tmp_path_factory.mktemp("warm"), str(d), "train.steps=1")))
    return str(d)


def metrics_rows(out_dir) -> list[dict]:
    """Every row a run logged to out_dir/metrics.jsonl."""
    return [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]


def tiny_overrides(out_dir, cache, *extra):
    """A model and budget small enough for a CPU test to train in seconds."""
    return [f"out_dir={out_dir}", f"data.cache_dir={cache}", "data.vocab_size=512", "model.n_layer=2",
            "model.d_model=32", "model.n_heads=2", "model.seq_len=32", "train.micro_batch=4",
            "train.global_batch_tokens=256", "train.log_interval=1", "train.eval_interval=1000",
            "train.eval_tokens=512", "train.ckpt_interval=1000", "train.sample_tokens=0", "train.progress=false",
            "logger.mode=disabled", "train.device=cpu", *extra]


def free_port() -> int:
    """A TCP port nothing listens on now. Fixed --master_port numbers were shared by tests (29547 by two files, run
    one after the other), and a clean-clone run (2026-11-27) saw one such torchrun exit 1 without train.py's
    message; the same test passed alone."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(fn, world: int, *args, timeout_s: float | None = None):
    """fn(rank, world, *args) in `world` processes (torch.multiprocessing.spawn) joined in a gloo process group on a
    free port; timeout_s: the group's (its collectives fail after it instead of hanging). One rank's exception or
    signal fails the caller."""
    import torch.multiprocessing as mp
    mp.spawn(_rank, args=(fn, world, free_port(), timeout_s, args), nprocs=world, join=True)


def _rank(rank: int, fn, world: int, port: int, timeout_s: float | None, args: tuple):
    from datetime import timedelta

    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            **({} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}))
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()
    # done: exit without the interpreter's finalization. The group outlives destroy_process_group where something
    # holds it (FSDP's mesh stays in DTensor's sharding caches), and finalized so, gloo's threads can abort the
    # process ("terminate called without an active exception", SIGABRT: an FSDP test of a clean clone, 2026-12-01;
    # a rank holding its group past destroy after three all_reduces aborted in 31 of 60 runs, none with this exit)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def torchrun(nproc: int) -> list[str]:
    """`torchrun --nproc_per_node=nproc --master_port=<a free port>`, this interpreter's."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port()}"]


def torchrun_train(nproc: int, out_dir, cache, *extra) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node=nproc train.py` on the tiny model and budget (tiny_overrides), on a free port,
    output captured."""
    return subprocess.run([*torchrun(nproc), "train.py", *tiny_overrides(out_dir, cache, *extra)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def pytest_runtest_teardown(item):
    """DUALITY_TUNE_OUT=DIR: after each test, write the kernel configs this process autotuned to DIR/<worker>
    (scripts/tune_kernels.py --merge adds them to kernels/configs/<GPU>): how the GPU group's own shapes get shipped
    configs."""
    if torch.cuda.is_available():
        import duality.kernels.tuned_configs as tc
        tc.dump_requested(os.environ.get("PYTEST_XDIST_WORKER", "main"))


def pytest_runtest_logreport(report):
    """DUALITY_TEST_FAILURES=FILE: append each failure's traceback as it happens (a GPU run stopped by a time limit
    still leaves them; pytest prints them only at the end)."""
    path = os.environ.get("DUALITY_TEST_FAILURES")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n")


# shared by the kernel tests (tests/kernels/) and the duality tests
def qkv(B=2, T=13, H=3, D=8, Tk=None):
    Tk = Tk or T
    return torch.randn(B, T, H, D), torch.randn(B, Tk, H, D), torch.randn(B, Tk, H, D)


def householder_product_scores(q, k, w, beta):
    """PaTH scores the slow way: build prod_{s=j+1..i} (I - beta_s w_s w_s^T) as a matrix for every (i, j)."""
    B, T, H, D = q.shape
    out = torch.zeros(B, H, T, T)
    eye = torch.eye(D)
    for b in range(B):
        for h in range(H):
            Hs = [eye - beta[b, s, h] * torch.outer(w[b, s, h], w[b, s, h]) for s in range(T)]
            for i in range(T):
                P = eye.clone()
                for j in range(i, -1, -1):  # P = H_{j+1} ... H_i
                    out[b, h, i, j] = k[b, j, h] @ P @ q[b, i, h]
                    P = Hs[j] @ P
    return out
