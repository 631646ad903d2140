"""Time to the first training step of a fresh process on a fresh machine, per backbone: what a user renting a GPU
waits before anything trains.

    python benchmarks/first_step.py                                   # every bench_train case, 370m/4096, compiled
    python benchmarks/first_step.py --cases gla+nope gated_deltanet+nope --configs off    # FLA autotuning, as before
    python benchmarks/first_step.py --out docs/gpu/first_step_h100.json --resume          # add the cases not yet there
    DUALITY_TUNE_OUT=/tmp/t python benchmarks/first_step.py  # also dump what each case autotuned (tune_kernels)
    python benchmarks/first_step.py --set train.compile_scope=model    # the whole model one graph (default: by block)

Each case runs in its own process with empty Triton and Inductor caches (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR
in a new temporary folder), so every kernel is compiled (and, without shipped configs, autotuned) as on a new
machine. Reported: `first_step_s`, the first step of bench_train.measure (build excluded: torch.compile's tracing
and compilation, Triton's compilation and autotuning, the step itself), the process's wall time from start to
exit (imports, model build, first and second step), and the median ms of the steps after it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def child(case: str, size: str, seq: int, compiled: bool, overrides=()):
    import torch
    from bench_train import measure

    import duality.kernels.tuned_configs as tc
    row = measure(case, size, seq, compiled, steps=2, warmup=1, overrides=overrides)
    row.update(configs=str(tc.config_dir()), configs_timed=tc.counts["benchmarks"],
               seeded_keys=tc.counts["seeded_keys"], borrowed_keys=tc.counts["borrowed_keys"],
               device=torch.cuda.get_device_name())
    print("ROW " + json.dumps(row), flush=True)
    tc.dump_requested(case.replace("+", "_"))  # what this case autotuned, for `tune_kernels.py --merge`


def fresh_process(argv: list[str], env: dict | None = None) -> tuple[dict | None, str, float]:
    """`python argv...` with empty Triton and Inductor caches (a new temporary folder) and `env` added: (the dict
    of the `ROW {json}` line it printed, or None; the tail of its stderr, else stdout; its wall time in s)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TRITON_CACHE_DIR": f"{tmp}/triton", "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
               **(env or {})}
        t = time.perf_counter()
        p = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("ROW ")]
    return (json.loads(line[0][4:]) if line else None), (p.stderr or p.stdout)[-3000:], wall


def main():
    from bench_train import CASES

    from duality.common.io import write_atomic
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=list(CASES))
    ap.add_argument("--setting", default="370m:4096", help="size:context")
    ap.add_argument("--compile", choices=["on", "off"], default="on")
    ap.add_argument("--configs", default=None, help="DUALITY_KERNEL_CONFIGS for the children (off: autotune)")
    ap.add_argument("--out", type=Path, help="JSON file of rows (written after every case)")
    ap.add_argument("--resume", action="store_true", help="skip the cases already in --out")
    ap.add_argument("--set", nargs="*", default=[], help="Hydra overrides for this repo's cases, e.g. "
                    "train.compile_scope=model")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    size, seq = a.setting.split(":")
    if a.child:
        return child(a.child, size, int(seq), a.compile == "on", a.set)
    rows = json.loads(a.out.read_text())["rows"] if a.resume and a.out and a.out.exists() else []
    done = {(r["case"], r["configs_arg"], tuple(r.get("overrides", ()))) for r in rows}
    for case in a.cases:
        if (case, a.configs, tuple(a.set)) in done:
            continue
        row, log, wall = fresh_process([__file__, "--child", case, "--setting", a.setting, "--compile", a.compile,
                                        "--set", *a.set],
                                       {"DUALITY_KERNEL_CONFIGS": a.configs} if a.configs is not None else None)
        row = row or {"case": case, "error": log[-2000:]}
        row.update(process_wall_s=wall, configs_arg=a.configs, overrides=a.set, date=time.strftime("%Y-%m-%d"))
        rows.append(row)
        print(f"{case:28s} first step {row.get('first_step_s', float('nan')):7.1f} s | process {wall:6.1f} s | "
              f"{row.get('ms', float('nan')):7.1f} ms/step | configs timed {row.get('configs_timed', '-')}"
              + (f" | ERROR {row['error'][-300:]}" if "error" in row else ""), flush=True)
        if a.out:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(a.out, json.dumps({"setting": a.setting, "compile": a.compile, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
