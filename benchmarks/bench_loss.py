"""The LM head's loss alone, forward + backward, by each way this repo can form it (`model.fused_loss`,
`model.fused_loss_impl`): time and peak memory at one training step's shape.

    python benchmarks/bench_loss.py                                   # 370m/4096: 32,768 tokens, d 1024, vocab 32k
    python benchmarks/bench_loss.py --tokens 32768 --d-model 768 --vocab 50304 --json docs/throughput/loss_h100.json

Ways, each a function of the final norm's bf16 output h [N, d], the fp32 head weight W [V, d] and the targets:
    logits             F.cross_entropy(h W^T in fp32), compiled (model.fused_loss=false)
    chunked            kernels/linear_ce in token chunks, each chunk's loss in PyTorch, compiled (Inductor's fusion)
    chunked_eager      the same, eager
    triton             kernels/linear_ce with its Triton kernel over each chunk's bf16 logits (the CUDA default)
Their losses and gradients are compared with the `logits` way's (relative difference). Median of --steps timed
passes after two warm-up passes, with CUDA events around each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from duality.kernels.linear_ce import linear_cross_entropy


def ways():
    def logits(h, w, y):
        return F.cross_entropy(F.linear(h, w).float(), y, ignore_index=-1)

    def chunked(h, w, y):
        return linear_cross_entropy(h, w, y, impl="chunked")
    return {"logits": torch.compile(logits), "chunked": torch.compile(chunked), "chunked_eager": chunked,
            "triton": lambda h, w, y: linear_cross_entropy(h, w, y, impl="triton")}


def measure(fn, h, w, y, steps: int):
    times, out = [], None
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    for i in range(steps + 2):
        h.grad = w.grad = None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(h, w, y)
        loss.backward()
        end.record()
        torch.cuda.synchronize()
        if i >= 2:
            times.append(start.elapsed_time(end))
        out = (loss.detach(), h.grad.float(), w.grad)
    return statistics.median(times), (torch.cuda.max_memory_allocated() - base) / 2 ** 30, out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8 * 4096)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--ways", nargs="+", default=list(ways()))
    ap.add_argument("--json", type=Path, help="write the rows here")
    a = ap.parse_args()
    g = torch.Generator("cuda").manual_seed(0)
    h = torch.randn(a.tokens, a.d_model, device="cuda", generator=g).bfloat16().requires_grad_()
    w = (0.02 * torch.randn(a.vocab, a.d_model, device="cuda", generator=g)).requires_grad_()
    y = torch.randint(0, a.vocab, (a.tokens,), device="cuda", generator=g)
    y[::97] = -1  # some positions without a target, as at document ends
    rows, ref = [], None
    fns = ways()
    print(f"{torch.cuda.get_device_name()}: {a.tokens} tokens, d {a.d_model}, vocab {a.vocab}, bf16 autocast")
    print("| way | ms fwd+bwd | peak GiB over inputs | loss | rel. diff of dL/dh, dL/dW vs logits |")
    print("|---|---:|---:|---:|---|")
    for name in a.ways:
        t0 = time.perf_counter()
        ms, peak, (loss, gh, gw) = measure(fns[name], h, w, y, a.steps)
        if ref is None:
            ref = (loss, gh, gw)
        diff = [float((x - r).norm() / r.norm()) for x, r in zip((gh, gw), ref[1:])]
        rows.append({"way": name, "ms": ms, "peak_gib": peak, "loss": float(loss), "rel_diff_gh": diff[0],
                     "rel_diff_gw": diff[1], "wall_s": time.perf_counter() - t0})
        print(f"| {name} | {ms:.2f} | {peak:.2f} | {float(loss):.5f} | {diff[0]:.1e}, {diff[1]:.1e} |", flush=True)
    if a.json:
        a.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                                      "torch": torch.__version__, "tokens": a.tokens, "d_model": a.d_model,
                                      "vocab": a.vocab, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
