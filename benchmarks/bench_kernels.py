"""Kernel-level benchmark of what the mixers call that bench_attention.py / bench_rotary.py do not cover, in one run.

    python benchmarks/bench_kernels.py [--out docs/throughput] [--shapes 4x4096 1x16384] [--only gla gated_delta_rule]

Forward and forward + backward (gradients to every input that needs one), bf16 inputs, each timed twice: the median
wall time of triton.testing.do_bench and the GPU time of the kernels alone (torch.profiler), which differ where the
host's launch work is the slower side; H = 16 heads of D = 64, at each B x T of --shapes (B*T fixed by default, so
a row's growth with T is the kernel's non-linear cost):
- the recurrences through kernels/recurrences/'s dispatch, as the mixers call them (FLA's chunked kernels): gated
  (GLA, per-channel gate), gated with a scalar gate (RetNet / Mamba2), delta rule, gated delta rule, gated Oja;
  PaTH attention and PaTH-FoX (FLA's parallel_path_attn via kernels/path_attention/);
- softmax attention as the yardstick in the same run: SDPA (cuDNN) and our decayed-attention kernel with FoX's gate;
- the short convolution of the Gated DeltaNet / FoX / PaTH mixers (model/core/layers.py ShortConv: FLA's kernel)
  against F.conv1d (cuDNN depthwise, compiled) on [B, T, 1024];
- the loss: kernels/linear_ce/ against F.linear + F.cross_entropy, both compiled, 32,768 tokens x 768 -> 50,304,
  under bf16 autocast with an fp32 weight, as in training.
Writes bench_kernels.{md,json} to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
import duality.kernels.attention as ka  # noqa: E402
from duality.kernels.linear_ce import linear_cross_entropy  # noqa: E402
from duality.kernels.path_attention import path_attention  # noqa: E402
from duality.kernels.recurrences import delta_rule, gated, oja  # noqa: E402

H, D = 16, 64


def sequence_cases(B, T):
    """name -> (fn, inputs); inputs in the layout each function takes, made outside the timing."""
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
    q, k, v = (r(B, T, H, D).bfloat16() for _ in range(3))
    kn = F.normalize(k.float(), dim=-1).bfloat16()
    qn = F.normalize(q.float(), dim=-1).bfloat16()
    gate = F.logsigmoid(r(B, T, H) + 3)  # per-token log forget gates, fp32
    beta = torch.sigmoid(r(B, T, H))
    s = D ** -0.5
    cases = {
        "sdpa_cudnn (softmax)": (
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            [t.transpose(1, 2).contiguous() for t in (q, k, v)]),
        "decayed_attention fox (ours)": (
            lambda q, k, v, f: ka.decayed_attention(q, k, v, log_decay=ka.cumulative_log_decay(f)), [q, k, v, gate]),
        "gla (chunk_gla)": (
            lambda q, k, v, g: gated(q, k, v, g, s)[0], [q, k, v, F.logsigmoid(r(B, T, H, D)) / 16]),
        "scalar gate (chunk_simple_gla)": (lambda q, k, v, g: gated(q, k, v, g[..., None], s)[0], [q, k, v, gate]),
        "delta_rule (chunk_delta_rule)": (lambda q, k, v, b: delta_rule(q, k, v, b, s)[0], [qn, kn, v, beta]),
        "gated_delta_rule (chunk_gated_delta_rule)": (
            lambda q, k, v, b, g: delta_rule(q, k, v, b, s, g)[0], [qn, kn, v, beta, gate]),
        "gated_oja (chunk_gated_oja_rule)": (
            lambda q, k, v, gv, b: oja(q, k, v, gv, b, s)[0],
            [q, k, F.normalize(v.float(), dim=-1).bfloat16(), F.logsigmoid(r(B, T, H, D) + 3), beta]),
        "path (parallel_path_attn)": (
            lambda q, k, v, w, b: path_attention(q, k, v, w, b), [q, k, v, kn.float(), 2 * beta]),
        "path_fox (parallel_path_attn)": (
            lambda q, k, v, w, b, f: path_attention(q, k, v, w, b, f), [q, k, v, kn.float(), 2 * beta, gate]),
    }
    return cases


def conv_cases(B, T, C=1024):
    from duality.model.core.layers import ShortConv
    conv = ShortConv(C).cuda()
    ours = lambda x: conv(x)  # noqa: E731
    cudnn = torch.compile(lambda x: F.silu(F.conv1d(F.pad(x.transpose(1, 2), (3, 0)), conv.weight.to(x.dtype),
                                                    groups=C)).transpose(1, 2))
    x = torch.randn(B, T, C, device="cuda").bfloat16()
    return {"short_conv (ShortConv: FLA causal_conv1d)": (ours, [x]),
            "short_conv (F.conv1d cuDNN, compiled)": (cudnn, [x])}


def loss_cases(n=32768, d=768, V=50304):
    """As in training: bf16 activations, an fp32 weight, bf16 autocast."""
    h = torch.randn(n, d, device="cuda").bfloat16()
    w = torch.randn(V, d, device="cuda") * 0.02
    y = torch.randint(0, V, (n,), device="cuda")
    plain = torch.compile(lambda h, w: F.cross_entropy(F.linear(h, w).float(), y))
    fused = torch.compile(lambda h, w: linear_cross_entropy(h, w, y, -1))  # compiled, as inside the model

    def autocast(fn):
        def f(*a):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return fn(*a)
        return f
    return {"linear + CE (full logits, compiled)": (autocast(plain), [h, w]),
            "linear + CE (kernels/linear_ce/)": (autocast(fused), [h, w])}


def gpu_ms(fn, n=10):
    """Summed GPU time of the kernels one call launches (torch.profiler), free of host launch overhead."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / 1e3 / n


def measure(fn, tensors):
    """(fwd, fwd+bwd) in ms twice: do_bench's wall time per call (L2 flushed; it includes the host's launch work
    when that is the slower side) and the GPU time of the kernels alone."""
    from triton.testing import do_bench
    ts = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
    out = fn(*ts)
    grad = torch.ones_like(out) if out.dim() == 0 else torch.randn_like(out)

    def both():
        for t in ts:
            t.grad = None
        fn(*ts).backward(grad)
    walls = [do_bench(f, warmup=10, rep=50, return_mode="median") for f in (lambda: fn(*ts), both)]
    return walls + [gpu_ms(lambda: fn(*ts)), gpu_ms(both)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["4x4096", "1x16384"], help="BxT")
    ap.add_argument("--only", nargs="+", default=None, help="substrings of case names")
    ap.add_argument("--out", default=str(ROOT / "docs" / "throughput"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_kernels.py measures GPU kernels: no CUDA device is visible")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []

    def run(label, cases):
        for name, (fn, tensors) in cases.items():
            if args.only and not any(o in name for o in args.only):
                continue
            t0 = time.perf_counter()
            try:
                fwd, both, fwd_gpu, both_gpu = measure(fn, tensors)
                row = {"shape": label, "case": name, "fwd_ms": fwd, "fwd_bwd_ms": both, "fwd_gpu_ms": fwd_gpu,
                       "fwd_bwd_gpu_ms": both_gpu}
            except Exception as e:  # noqa: BLE001 -- a kernel limit must not end the run
                row = {"shape": label, "case": name, "error": f"{type(e).__name__}: {str(e)[:120]}"}
            row["first_call_s"] = time.perf_counter() - t0
            rows.append(row)
            print(json.dumps(row), flush=True)

    for B, T in (map(int, s.split("x")) for s in args.shapes):
        run(f"B={B} T={T}", {**sequence_cases(B, T), **conv_cases(B, T)})
    run("32768 tokens, 768 -> 50304", loss_cases())
    meta = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "command": " ".join(sys.argv)}
    lines = [f"{meta['device']}, {meta['date']}, torch {meta['torch']}: `{meta['command']}`; H={H}, D={D}, bf16",
             "", "ms per call: wall (do_bench) / GPU (the kernels' summed time, without host launch overhead)", "",
             "| shape | kernel | fwd wall | fwd+bwd wall | fwd GPU | fwd+bwd GPU |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        times = " | ".join(f"{r[k]:.2f}" for k in ("fwd_ms", "fwd_bwd_ms", "fwd_gpu_ms", "fwd_bwd_gpu_ms")) \
            if "error" not in r else f"{r['error']} | | |"
        lines.append(f"| {r['shape']} | {r['case']} | {times} |")
    (out / "bench_kernels.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    (out / "bench_kernels.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
