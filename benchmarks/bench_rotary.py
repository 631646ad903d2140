"""Benchmark and GPU check of the cumulative-rotation prelude (Selective RoPE's cumsum + sincos + rotate q and k).

    python benchmarks/bench_rotary.py [--B 4 --T 4096 --H 16 --D 64] [--json out.json]

Times three implementations of the same function in one run (triton.testing.do_bench, L2 flushed between runs):
PyTorch eager (kernels/rotary/ reference), torch.compile of that reference, and the fused Triton kernel; forward
and forward + backward (gradients to q, k and the increments), in ms and in achieved TB/s, where the forward's
minimum traffic is read q, k, dphi + write q, k. A copy of a 1 GiB tensor in the same run gives the bandwidth
ceiling. Then kernel-vs-float64 relative errors at the benchmark shape and at T = 65,536 (angles ~ 6.5e4 rad).
Block sizes (tokens per chunk) can be swept with --block-t 32 64 128.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from duality.kernels.rotary import cumulative_rotation, cumulative_rotation_reference  # noqa: E402


def bench(fn, **kw):
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=100, **kw)


def copy_bandwidth():
    x = torch.empty(2 ** 29, dtype=torch.bfloat16, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return 2 * x.numel() * 2 / ms / 1e9  # TB/s (read + write)


def inputs(B, T, H, D, dtype, grad=False, mean=0.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, T, H, D, device="cuda", generator=g).to(dtype)
    k = torch.randn(B, T, H, D, device="cuda", generator=g).to(dtype)
    dphi = (mean + torch.randn(B, T, H, D // 2, device="cuda", generator=g)).to(dtype)
    theta = 500000.0 ** (-torch.arange(0, D, 2, device="cuda").float() / D)
    if grad:
        for t in (q, k, dphi):
            t.requires_grad_()
    return q, k, dphi, theta


def timing(args, block_t=None):
    if block_t:
        os.environ["ROTARY_BLOCK_T"] = str(block_t)
    B, T, H, D = args.B, args.T, args.H, args.D
    dt = torch.bfloat16
    q, k, dphi, theta = inputs(B, T, H, D, dt, grad=True)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    ref = lambda *a: cumulative_rotation_reference(*a)[:2]  # noqa: E731
    compiled = torch.compile(ref)
    fused = lambda *a: cumulative_rotation(*a, impl="triton")[:2]  # noqa: E731
    byte = torch.finfo(dt).bits // 8
    traffic = (2 * 2 * B * T * H * D + B * T * H * D // 2) * byte  # read q, k, dphi; write q, k
    rows = []
    for name, fn in [("eager", ref), ("torch.compile", compiled), ("fused triton", fused)]:
        with torch.no_grad():
            f_ms = bench(lambda: fn(q, k, dphi, theta))

        def fb():
            a, b = fn(q, k, dphi, theta)
            torch.autograd.backward([a, b], [gq, gk])
        fb_ms = bench(fb, grad_to_none=[q, k, dphi])
        rows.append({"impl": name, "fwd_ms": f_ms, "fwdbwd_ms": fb_ms, "fwd_TBps": traffic / f_ms / 1e9})
    return rows, traffic


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def errors(B, T, H, D, dtype, mean):
    q, k, dphi, theta = inputs(B, T, H, D, dtype, grad=True, mean=mean, seed=1)
    out = cumulative_rotation(q, k, dphi, theta, impl="triton")
    d64 = [t.detach().double().requires_grad_() for t in (q, k, dphi)]
    want = cumulative_rotation_reference(*d64, theta.double())
    f32 = cumulative_rotation_reference(*[t.detach().float() for t in (q, k, dphi)], theta)  # the fp32 PyTorch path
    g = [torch.randn_like(want[0]), torch.randn_like(want[1])]
    got_g = torch.autograd.grad(out[:2], [q, k, dphi], [x.to(dtype) for x in g])
    want_g = torch.autograd.grad(want[:2], d64, g)
    res = {"shape": [B, T, H, D], "dtype": str(dtype).replace("torch.", ""), "dphi_mean": mean,
           "max_angle_rad": float(want[2].detach().abs().max() * theta.max()),
           "q": rel(out[0], want[0]), "k": rel(out[1], want[1]), "q_torch_fp32": rel(f32[0], want[0])}
    res.update({f"d{n}": rel(a, b) for n, a, b in zip(["q", "k", "dphi"], got_g, want_g)})
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--block-t", type=int, nargs="*", default=[])
    ap.add_argument("--no-errors", action="store_true")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_rotary.py needs a CUDA GPU")
    dev = torch.cuda.get_device_name()
    ceiling = copy_bandwidth()
    print(f"device: {dev}, torch {torch.__version__}; copy bandwidth {ceiling:.2f} TB/s")
    result = {"device": dev, "torch": torch.__version__, "copy_TBps": ceiling, "runs": []}
    for bt in args.block_t or [None]:
        rows, traffic = timing(args, bt)
        label = f"block_t={bt}" if bt else "default block"
        print(f"\nB={args.B} T={args.T} H={args.H} D={args.D} bf16, {label}; forward minimum traffic "
              f"{traffic / 1e9:.3f} GB")
        print("| impl | fwd ms | fwd+bwd ms | fwd TB/s | fwd % of copy | fwd speedup vs compile | fwd+bwd speedup |")
        print("|---|---|---|---|---|---|---|")
        c = rows[1]
        for r in rows:
            print(f"| {r['impl']} | {r['fwd_ms']:.3f} | {r['fwdbwd_ms']:.3f} | {r['fwd_TBps']:.2f} | "
                  f"{100 * r['fwd_TBps'] / ceiling:.0f}% | {c['fwd_ms'] / r['fwd_ms']:.2f}x | "
                  f"{c['fwdbwd_ms'] / r['fwdbwd_ms']:.2f}x |")
        result["runs"].append({"block_t": bt, "rows": rows, "traffic_bytes": traffic})
    if not args.no_errors:
        os.environ.pop("ROTARY_BLOCK_T", None)
        result["errors"] = []
        for shape, dt, mean in [((4, 4096, 16, 64), torch.bfloat16, 0.0), ((4, 4096, 16, 64), torch.float32, 0.0),
                                ((1, 65536, 16, 64), torch.float32, 1.0), ((1, 65536, 16, 64), torch.bfloat16, 1.0)]:
            e = errors(*shape, dt, mean)
            result["errors"].append(e)
            print("errors vs float64:",
                  json.dumps({k: (f"{v:.2e}" if isinstance(v, float) else v) for k, v in e.items()}))
        # the look-back synchronises programs through memory: repeat to catch a race, were there one
        worst = max(max(errors(4, 4096, 16, 64, torch.float32, 0.5)[n] for n in ("q", "k", "dq", "dk", "ddphi"))
                    for _ in range(args.repeats))
        result["repeat_worst_rel_err"] = worst
        print(f"{args.repeats} repeated fp32 runs, worst relative error of any output or gradient: {worst:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
