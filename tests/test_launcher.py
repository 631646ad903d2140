"""hydra/launcher=gpus (hydra_plugins/duality_launcher/gpus.py): a sweep's jobs dealt out to GPUs, each a process with
its own CUDA_VISIBLE_DEVICES, run here on the CPU (train.device=cpu) with two named "GPUs"."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, compose, metrics_rows, tiny_overrides

from duality import train as train_lib


@pytest.mark.slow
def test_jobs_are_dealt_to_the_gpus_and_train_as_the_same_single_runs(tmp_path, data_cache):
    args = [a for a in tiny_overrides(tmp_path / "x", data_cache, "train.steps=2") if not a.startswith("out_dir")]
    sweep = tmp_path / "sweep"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    threads = max(1, len(os.sched_getaffinity(0)) // 2)  # the cores shared out over the two jobs at once
    # six jobs on two GPUs, so most wait for a GPU; the three with warmup -1 fail (a bad value, exit code 2)
    r = subprocess.run([sys.executable, "train.py", "-m", "hydra/launcher=gpus", "hydra.launcher.gpus=[3,5]",
                        f"hydra.launcher.slots_dir={tmp_path / 'slots'}",
                        "pe=nope,rope,alibi", f"hydra.sweep.dir={sweep}", *args, "optim.warmup=0,-1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    # the launch ends with one line, not the traceback of Hydra's sweeper naming the first failed job
    assert (r.returncode, r.stderr.splitlines()[-1:]) == (1, [
        "error: 3 of 6 jobs failed (why: the launch's summary above, and each job's job.log)"]), r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "\t3 failed with: error: optim.warmup" in r.stdout
    jobs = {j["job"]: j for j in map(json.loads, (sweep / "launcher.jsonl").read_text().splitlines())}
    assert set(jobs) == set(range(6))  # 3 schemes x 2 warmups
    assert not (sweep / ".launcher").exists()  # the jobs' payloads, read and removed
    assert {j["gpu"] for j in jobs.values()} == {3, 5}
    assert {j["host"] for j in jobs.values()} == {socket.gethostname()}  # which machine's GPUs (results.gpu_seconds)
    for n, j in jobs.items():
        bad = "optim.warmup=-1" in j["overrides"]
        assert (j["status"], j["returncode"]) == (("FAILED", 2) if bad else ("COMPLETED", 0))
        log = (sweep / str(n) / "job.log").read_text()
        assert log.startswith(f"[launcher] job {n}: CUDA_VISIBLE_DEVICES={j['gpu']} OMP_NUM_THREADS={threads} "
                              f"(torch: {threads})\n")
        assert ("error: optim.warmup" in log) == bad
    assert f"[hydra] Launching 6 jobs on GPUs [3, 5], 1 at once on each, {threads} CPU threads each" in r.stdout
    # a finished job trained exactly as the same settings run on their own
    n = next(n for n, j in jobs.items() if "pe=rope" in j["overrides"] and "optim.warmup=0" in j["overrides"])
    train_lib.run(compose([*tiny_overrides(tmp_path / "alone", data_cache, "train.steps=2"), "pe=rope",
                           "optim.warmup=0"]))
    rows = [x for x in metrics_rows(sweep / str(n)) if "loss" in x]
    assert len(rows) == 2 and [x["loss"] for x in rows] == [x["loss"] for x in metrics_rows(tmp_path / "alone")
                                                            if "loss" in x]


def test_per_gpu_must_be_positive():
    from hydra_plugins.duality_launcher.gpus import GPUsLauncher
    with pytest.raises(ValueError, match="per_gpu=0: at least 1"):
        GPUsLauncher(gpus=[0], per_gpu=0)
    assert GPUsLauncher(gpus=["1", 3, "GPU-5c6f"]).gpus == [1, 3, "GPU-5c6f"]


def test_the_default_gpus_are_the_ones_cuda_visible_devices_names(monkeypatch):
    """A job handed "0" inside a process limited to GPUs 2 and 3 would run on the machine's GPU 0: the default list
    is CUDA_VISIBLE_DEVICES's own entries."""
    from hydra_plugins.duality_launcher.gpus import visible_gpus
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert visible_gpus() == [2, 3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpus() == list(range(torch.cuda.device_count()))


def test_train_runs_where_the_launcher_is_not_importable(monkeypatch):
    """The repo on PYTHONPATH without an install (and Python's safe-path mode, which drops the script's folder) has
    no `hydra_plugins` package: train.py must still start, without hydra/launcher=gpus (it failed every run so, on the
    GPU machines, before this)."""
    from hydra.core.plugins import Plugins

    from duality.common import cli
    name = "hydra_plugins.duality_launcher.gpus.GPUsLauncher"
    Plugins.instance().class_name_to_class.pop(name, None)
    monkeypatch.setitem(sys.modules, "hydra_plugins.duality_launcher.gpus", None)  # import raises ImportError
    cli._register_launcher()
    assert name not in Plugins.instance().class_name_to_class
    monkeypatch.undo()
    cli._register_launcher()
    assert Plugins.instance().class_name_to_class[name].__name__ == "GPUsLauncher"


def test_the_launcher_registers_from_a_checkout_on_pythonpath_without_an_install(tmp_path):
    """The repo reached through a `duality` link on PYTHONPATH, not installed (as on a bare GPU machine): importing
    duality takes the root off sys.path, and Hydra answered hydra/launcher=gpus with "Unknown plugin class". The
    plugin is now read from the root, and the root is off sys.path again after."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "duality").symlink_to(ROOT)
    probe = f"""
import sys
editable = lambda f: "__editable__" in (getattr(f, "__module__", "") or type(f).__module__)
sys.meta_path[:] = [f for f in sys.meta_path if not editable(f)]
sys.path_hooks[:] = [h for h in sys.path_hooks if "__editable__" not in getattr(h, "__module__", "")]
sys.path[:] = [p for p in sys.path if "__editable__" not in p]
sys.path_importer_cache.clear()
sys.path.insert(0, {str(tmp_path / 'site')!r})
try:
    import hydra_plugins.duality_launcher
    print("importable before")
except ImportError:
    pass
from duality.common import cli
cli._register_launcher()
from hydra.core.plugins import Plugins
print("registered" if "hydra_plugins.duality_launcher.gpus.GPUsLauncher" in Plugins.instance().class_name_to_class
      else "missing", {str(ROOT)!r} in sys.path)
"""
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["registered", "False"]
