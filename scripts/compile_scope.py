"""Compilation time and step time of a case compiled whole (train.compile_scope=model) against block by block
(train.compile_scope=blocks), each scope in a fresh process with an empty Inductor cache; on a GPU (bf16 autocast)
or on the CPU (float32, Inductor's C++ code).

    python scripts/compile_scope.py --case gla+nope --size 124m --seq 128 --batch 2 --steps 3    # a CPU machine
    python scripts/compile_scope.py --case transformer+rope gla+nope --size 370m --seq 4096 --batch 8 \\
        --out docs/throughput/compile_scope_h100.json                                             # a GPU

Reported per case and scope: the first step (tracing, compilation, the step), the median of the next steps, the
loss of the first step (the two scopes must agree), and the graphs Dynamo made. On a GPU, bench_train.py
--set train.compile_scope=blocks gives the throughput with the repo's usual settings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def child(case: str, size: str, seq: int, batch: int, steps: int, scope: str) -> dict:
    import torch
    from bench_train import SETTINGS, build
    from torch._dynamo.utils import counters

    from duality.trainer.optim import make_optimizer
    model_name, _, vocab = SETTINGS.get(size, (size, 0, 512))  # conf/model/<size>.yaml, vocabulary 512
    torch.manual_seed(0)
    model, optim_cfg, compile_ = build(case, model_name, seq, vocab, [f"train.compile_scope={scope}"], True)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    model = model.to(device)
    optimizer = make_optimizer(model, optim_cfg, fused=cuda)
    run = compile_(model)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)
    data = torch.randint(0, vocab, (batch, seq + 1), device=device)
    times, loss0 = [], None
    for i in range(steps + 1):
        t = time.perf_counter()
        with autocast:
            loss = run(data[:, :-1], data[:, 1:])[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        loss0 = float(loss.detach()) if loss0 is None else loss0
    return dict(case=case, scope=scope, size=size, seq_len=seq, batch=batch, first_step_s=times[0],
                step_s=statistics.median(times[1:]), loss=loss0, graphs=counters["stats"]["unique_graphs"],
                device=torch.cuda.get_device_name() if cuda else "cpu", torch=torch.__version__)


def main():
    from first_step import fresh_process
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", nargs="+", default=["transformer+rope", "gla+nope"])
    ap.add_argument("--size", default="124m")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="timed steps after the first")
    ap.add_argument("--out", type=Path, help="JSON record of the rows")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print("ROW " + json.dumps(child(a.child[0], a.size, a.seq, a.batch, a.steps, a.child[1])), flush=True)
        return
    rows = []
    for case in a.case:
        for scope in ("model", "blocks"):
            r, log, _ = fresh_process([__file__, "--child", case, scope, "--size", a.size, "--seq", str(a.seq),
                                       "--batch", str(a.batch), "--steps", str(a.steps)])
            if r is None:
                sys.exit(f"{case} {scope} failed:\n{log}")
            rows.append(r)
            print(f"{case:20s} {scope:6s} first step {r['first_step_s']:7.1f} s | step {r['step_s'] * 1e3:8.1f} ms | "
                  f"loss {r['loss']:.6f} | {r['graphs']} graphs", flush=True)
    if a.out:
        from duality.common.io import write_atomic
        write_atomic(a.out, json.dumps({"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
                                        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
