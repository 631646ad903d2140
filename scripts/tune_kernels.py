"""Autotune the Triton kernels this repo calls (FLA's) once on this GPU, for the shapes it trains and tests at, and
write the winners to kernels/configs/<GPU>/ (kernels/tuned_configs.py loads them by default on that GPU).

    python scripts/tune_kernels.py                       # every workload below, merged into kernels/configs/<GPU>
    python scripts/tune_kernels.py --only 370m --jobs 4  # a subset, four processes at once (over the GPUs, if several)
    python scripts/tune_kernels.py --merge OUT/a OUT/b   # merge folders written elsewhere (e.g. the GPU test group
                                                         # run with DUALITY_TUNE_OUT=..., one folder per worker)
    python scripts/tune_kernels.py --list                # the workloads

A workload is one forward + backward (bf16 autocast, as train.py steps) of a two-layer model of the given backbone
at the given width, micro-batch and context, optionally with packed documents (FLA's varlen kernels) and a forward that
returns the recurrent state (decoding's prefill). Keys already shipped are not tuned again (the shipped configs
are loaded first; --retune ignores them). A stopped --jobs run leaves its processes' results in OUT/.parts/*:
`--merge OUT/.parts/*` keeps them. With --jobs N the workloads run in N processes at once: Triton's
compilation of the candidate configs, which dominates, spreads over the CPU cores, at the price of noisier timings;
on a machine of several GPUs the processes are dealt out over them, one GPU each while there are enough.
Each workload runs in a process of its own, so one that crashes the CUDA context loses only itself; the run exits 1
naming the workloads that failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

FLA_BACKBONES = ["gla", "retnet", "mamba2", "linear_attn", "deltanet", "gated_deltanet", "gated_oja", "path",
                 "path_fox"]
# name: (Hydra overrides without the backbone, micro-batch, context); vocabulary 512 (it does not touch the kernels)
SIZES = {
    "124m": (["model=124m"], 32, 1024),
    "370m": (["model=370m"], 8, 4096),
    "370m_16k": (["model=370m", "model.seq_len=16384"], 2, 16384),
    # scale.sh's 1.3B runs (micro-batch 4 x 4,096): untuned, GLA's first step on a fresh H200 passed 4 minutes
    "1_3b": (["model=1_3b"], 4, 4096),
    "state_tracking": (["task=state_tracking"], 256, 128),
    "mqar": (["task=mqar"], 512, 128),
    # the MQAR runs at d_model 64 and 256 have other head sizes, so other keys (H100, 2026-11-25: mqar_d64:gla took
    # 351 s to tune, 420 configs, shipped; mqar_d256:gla not yet)
    "mqar_d64": (["task=mqar", "model.d_model=64"], 512, 256),
    "mqar_d256": (["task=mqar", "model.d_model=256"], 256, 256),
    "copying": (["task=copying"], 256, 419),
}
# what the task's runs change in a backbone's shapes (the seed's GLA: a key per head of d_model / n_heads)
BACKBONE_OVERRIDES = {"state_tracking:gla": ["backbone.expand_k=1.0"], "copying:gla": ["backbone.expand_k=1.0"]}


def workloads(only=None):
    out = []
    for size in SIZES:
        for bb in FLA_BACKBONES:
            name = f"{size}:{bb}"
            if not only or any(o in (size, bb, name) for o in only):
                out.append(name)
    return out


def run_workload(name: str):
    import torch

    from duality.model import build_model
    size, bb = name.split(":")
    overrides, B, T = SIZES[size]
    from bench_train import compose
    pe = "nope" if bb.startswith("path") else "rope"
    # two layers: the tuning keys (heads, head sizes, chunk size, dtypes, batch) do not depend on the depth
    cfg = compose([*overrides, f"backbone={bb}", *BACKBONE_OVERRIDES.get(name, []), f"pe={pe}", f"model.seq_len={T}",
                   "model.n_layer=2"])
    model_cfg = {**cfg.model, "head": "lm"}
    torch.manual_seed(0)
    m = build_model(cfg.backbone, cfg.pe, model_cfg, 512).cuda()
    x = torch.randint(0, 512, (B, T + 1), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = m(x[:, :-1], x[:, 1:])[1]
    loss.backward()
    if m.blocks[0].mixer.packed:  # packed documents: the varlen kernels (train.doc_boundaries)
        n = min(B * T, 32768)
        cu = torch.tensor(sorted({0, n, *torch.randint(1, n, (7,)).tolist()}), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(x.flatten()[None, :n], x.flatten()[None, 1:n + 1], cu_seqlens=cu)[1]
        loss.backward()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):  # prefill: the state-returning forward
        m.generate(x[:2, :min(T, 512)], 2, temperature=0)
    torch.cuda.synchronize()


def worker(names, out: Path, retune: bool = False) -> int:
    """Tune each workload and dump what it added to out/. Several: each in a process of its own, so one that crashes
    (an illegal memory access while timing a candidate leaves the CUDA context unusable: PaTH at the state-tracking
    shape on an H200, 2026-11-27) costs only itself. Returns the number that failed."""
    if len(names) > 1:
        failed = []
        for name in names:
            cmd = [sys.executable, __file__, "--out", str(out), *(["--retune"] if retune else []), "--worker", name]
            if subprocess.run(cmd).returncode:
                failed.append(name)
                print(f"{name}: failed (its process's output above); going on with the next", flush=True)
        if failed:
            print(f"failed: {' '.join(failed)}", flush=True)
        return len(failed)
    import duality.kernels.tuned_configs as tc
    name, = names
    t = time.perf_counter()
    before = tc.counts["benchmarks"]
    run_workload(name)
    added = tc.dump(out)
    print(f"{name}: {time.perf_counter() - t:.1f} s, {tc.counts['benchmarks'] - before} configs timed, "
          f"{added} new entries", flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="sizes, backbones or size:backbone names")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", type=Path, help="folder to write (default kernels/configs/<GPU>)")
    ap.add_argument("--retune", action="store_true", help="ignore the shipped configs")
    ap.add_argument("--merge", nargs="*", type=Path, help="merge these folders into --out and stop")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.list:
        print("\n".join(workloads(a.only)))
        return
    if a.retune:
        os.environ["DUALITY_KERNEL_CONFIGS"] = "off"
    import duality.kernels.tuned_configs as tc
    own = tc.CONFIG_ROOT / (tc.gpu_name() or "cpu")
    out = a.out or own
    if not os.environ.get(tc.ENV):  # this GPU's own folder alone: what it lacks is tuned, not borrowed from a sibling
        os.environ[tc.ENV] = str(own) if own.is_dir() else "off"  # (the workers inherit it)
    if a.merge is not None:
        print(f"{merge(a.merge, out)} entries added to {out}")
        return
    if a.worker is not None:
        sys.exit(1 if worker(a.worker, out, a.retune) else 0)
    names = workloads(a.only)
    if a.jobs <= 1:
        sys.exit(1 if worker(names, out, a.retune) else 0)
    # N processes, each its own folder (no two writers of one file), merged at the end
    parts_of = [names[i::a.jobs] for i in range(a.jobs)]
    parts = out / ".parts"  # one folder per process (no two writers of one file); kept if this run is stopped
    procs = [subprocess.Popen([sys.executable, __file__, "--out", str(parts / str(i)),
                               *(["--retune"] if a.retune else []), "--worker", *p], env=job_env(i))
             for i, p in enumerate(parts_of) if p]
    rc = [p.wait() for p in procs]
    print(f"{merge(sorted(parts.glob('*')), out)} entries added to {out}")
    shutil.rmtree(parts)
    sys.exit(max(rc))


def job_env(i: int) -> dict:
    """The environment of --jobs process i: on a machine of several GPUs, the processes are dealt out over the
    visible ones (CUDA_VISIBLE_DEVICES, or all), one GPU each, so fewer share a GPU while timing candidates."""
    from hydra_plugins.duality_launcher.gpus import visible_gpus  # the sweep launcher's reading of them
    gpus = visible_gpus()
    return {**os.environ, **({"CUDA_VISIBLE_DEVICES": str(gpus[i % len(gpus)])} if len(gpus) > 1 else {})}


def merge(folders, out: Path) -> int:
    """Union of the entries of each kernel's file in `folders` into out/ (existing entries win)."""
    from duality.kernels.tuned_configs import write_entries
    added = 0
    for f in folders:
        for path in sorted(Path(f).glob("*.json")):
            data = json.loads(path.read_text())
            added += write_entries(out, data["kernel_name"], data.get("autotune_entries", {}),
                                   data.get("triton_version"))
    return added


if __name__ == "__main__":
    main()
