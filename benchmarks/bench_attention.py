"""Benchmark of the decayed-attention kernel (kernels/attention/) against its peers, in one run on one GPU.

    python benchmarks/bench_attention.py [--B 4 --T 4096 --H 16 --D 64] [--out docs/attention]  # table + JSON + PNG
    python benchmarks/bench_attention.py --memory            # + peak memory at T = 16,384 and 65,536 with B*T fixed
    python benchmarks/bench_attention.py --sweep --only ours_fox ours_sympow2_gated   # tile configurations

Every case computes causal attention over q, k, v in bf16 (each in its preferred layout, made outside the timing):
forward, and forward + backward with gradients to q, k, v and to the gate where there is one. Times are medians of
triton.testing.do_bench (L2 flushed between runs); peak memory is torch's allocator peak over one forward + backward
minus the inputs. Peers: torch SDPA with the cuDNN and FlashAttention-2 backends, FlexAttention (compiled; a
score_mod for the FoX bias c_i - c_j with its gradient, for ALiBi, and for sympow p = 2 with gating as
2 log|s| + c_i - c_j), flash-linear-attention's parallel_forgetting_attn (when installed), and sympow p = 2 gated
written naively in PyTorch and compiled.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

import duality.kernels.attention as ka  # noqa: E402
from duality.model.pe.alibi import alibi_slopes  # noqa: E402


def make_inputs(B, T, H, D, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
    bthd = [r(B, T, H, D).bfloat16() for _ in range(3)]
    f = torch.nn.functional.logsigmoid(r(B, T, H) + 3)  # per-token log gates, fp32
    return {"bthd": bthd, "bhtd": [t.transpose(1, 2).contiguous() for t in bthd], "f": f,
            "c_bth": torch.cumsum(f, 1), "c_bht": torch.cumsum(f, 1).transpose(1, 2).contiguous(),
            "m": alibi_slopes(H).cuda()}


def cases(x, D):
    """name -> (function of the differentiable tensors, those tensors)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    F = torch.nn.functional
    B, H, T, _ = x["bhtd"][0].shape
    q4, k4, v4 = x["bthd"]
    qh, kh, vh = x["bhtd"]
    out = {}

    def sdpa(backend):
        def f(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return f
    out["sdpa_cudnn"] = (sdpa(SDPBackend.CUDNN_ATTENTION), [qh, kh, vh])
    out["sdpa_fa2"] = (sdpa(SDPBackend.FLASH_ATTENTION), [qh, kh, vh])

    flex = torch.compile(flex_attention)
    mask = create_block_mask(lambda b, h, i, j: j <= i, None, None, T, T)
    out["flex_causal"] = (lambda q, k, v: flex(q, k, v, block_mask=mask), [qh, kh, vh])

    # FlexAttention refuses two lookups into one tensor that needs a gradient: c goes in twice (its gradient is the sum)
    def flex_fox(q, k, v, ci, cj):
        return flex(q, k, v, score_mod=lambda s, b, h, i, j: s + ci[b, h, i] - cj[b, h, j], block_mask=mask)
    out["flex_fox"] = (flex_fox, [qh, kh, vh, x["c_bht"], x["c_bht"]])
    m = x["m"]
    out["flex_alibi"] = (lambda q, k, v: flex(q, k, v, score_mod=lambda s, b, h, i, j: s - m[h] * (i - j),
                                              block_mask=mask), [qh, kh, vh])

    def flex_sympow(q, k, v, ci, cj):  # softmax of 2 log|s| + c_i - c_j == s^2 b_ij / sum
        return flex(q, k, v, score_mod=lambda s, b, h, i, j: 2 * torch.log(torch.abs(s)) + ci[b, h, i] - cj[b, h, j],
                    block_mask=mask)
    out["flex_sympow2_gated"] = (flex_sympow, [qh, kh, vh, x["c_bht"], x["c_bht"]])

    @torch.compile
    def naive_sympow(q, k, v, c):
        s = (q @ k.transpose(-1, -2)).float() / math.sqrt(D)
        w = (s * s * torch.exp(c[..., :, None] - c[..., None, :])).tril()
        return ((w / w.sum(-1, keepdim=True)).to(v.dtype) @ v)
    out["naive_sympow2_gated_compiled"] = (naive_sympow, [qh, kh, vh, x["c_bht"]])
    try:
        from fla.ops.forgetting_attn import parallel_forgetting_attn
        out["fla_fox"] = (lambda q, k, v, f: parallel_forgetting_attn(q, k, v, f), [q4, k4, v4, x["f"]])
    except ImportError:
        pass

    def ours(power=None, gate=False, alibi=False):
        def f(q, k, v, *c):
            return ka.decayed_attention(q, k, v, log_decay=c[0] if gate else None, slopes=m if alibi else None,
                                        power=power, impl="triton")
        return f, [q4, k4, v4] + ([x["c_bth"]] if gate else [])
    out["ours_softmax"] = ours()
    out["ours_fox"] = ours(gate=True)
    out["ours_alibi"] = ours(alibi=True)
    out["ours_sympow2"] = ours(power=2)
    out["ours_sympow2_gated"] = ours(power=2, gate=True)
    out["ours_sympow4_gated"] = ours(power=4, gate=True)
    return out


def measure(fn, tensors, memory=True):
    from triton.testing import do_bench
    ts = [t.detach().clone().requires_grad_() for t in tensors]
    do = torch.randn_like(fn(*ts))
    fwd = do_bench(lambda: fn(*ts), warmup=25, rep=100, return_mode="median")

    def step():
        fn(*ts).backward(do)
    both = do_bench(step, warmup=25, rep=100, grad_to_none=ts, return_mode="median")
    res = {"fwd_ms": fwd, "fwd_bwd_ms": both}
    if memory:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        res["peak_gib"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
    return res


def table(rows, keys):
    head = "| case | " + " | ".join(keys) + " |"
    lines = [head, "|" + "---|" * (len(keys) + 1)]
    for name, r in rows.items():
        cells = [("—" if r.get(k) is None else f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k])) for k in keys]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [n for n in rows if "fwd_bwd_ms" in rows[n]]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(names) + 1.2))
    y = range(len(names))
    ax.barh(y, [rows[n]["fwd_bwd_ms"] for n in names], color=["C1" if n.startswith("ours") else "C0" for n in names],
            label="forward + backward")
    ax.barh(y, [rows[n]["fwd_ms"] for n in names], color="black", alpha=0.35, label="forward")
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    ax.set_xlabel("ms (lower is better)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--only", nargs="+")
    ap.add_argument("--memory", action="store_true", help="peak memory of ours at T = 16,384 and 65,536, B*T fixed")
    ap.add_argument("--sweep", action="store_true", help="time tile configurations of ours")
    ap.add_argument("--sweep-kernels", nargs="+", default=["fwd", "dkdv", "dq"],
                    choices=["fwd", "dkdv", "dkdv_power", "dq"])
    ap.add_argument("--blocks", type=int, nargs="+", default=[128], help="held block sizes to sweep")
    ap.add_argument("--out", default="outputs/bench_attention")
    a = ap.parse_args()
    import triton
    dev = torch.cuda.get_device_name()
    head = (f"# {time.strftime('%Y-%m-%d')}, {dev}, torch {torch.__version__}, triton {triton.__version__}; "
            f"B={a.B} T={a.T} H={a.H} D={a.D} bf16, causal")
    print(head, flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    x = make_inputs(a.B, a.T, a.H, a.D)
    rows = {}
    if a.sweep:  # one kernel's tiles at a time (block, inner block, warps, stages), the others at their default
        base = {n: v for n, v in ka.CONFIG.items()}
        grid = {"fwd": [(bn, w, st) for bn in (32, 64) for w in (4, 8) for st in (2, 3, 4)],
                "dkdv": [(bm, w, st) for bm in (16, 32, 64) for w in (4, 8) for st in (2, 3, 4)],
                "dkdv_power": [(bm, w, st) for bm in (16, 32, 64) for w in (4, 8) for st in (2, 3, 4)],
                "dq": [(bn, w, st) for bn in (16, 32, 64) for w in (4, 8) for st in (2, 3, 4)]}
        for block in a.blocks:
            for kern, options in ((k, grid[k]) for k in a.sweep_kernels):
                for opt in options:
                    ka.CONFIG.update(base, block=block, **{kern: opt})
                    for name, (fn, ts) in cases(x, a.D).items():
                        if name.startswith("ours") and (not a.only or name in a.only):
                            key = f"{name} block={block} {kern}={opt}"
                            try:
                                rows[key] = measure(fn, ts, memory=False)
                            except Exception as e:  # e.g. out of shared memory for a large tile
                                rows[key] = {"error": type(e).__name__}
                            print(key, rows[key], flush=True)
        ka.CONFIG.clear()
        ka.CONFIG.update(base)
    else:
        for name, (fn, ts) in cases(x, a.D).items():
            if a.only and name not in a.only:
                continue
            try:
                rows[name] = measure(fn, ts)
            except Exception as e:  # report and go on (a peer may refuse this shape)
                rows[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            print(name, rows[name], flush=True)
            torch.cuda.empty_cache()
    text = head + "\n\n" + table(rows, ["fwd_ms", "fwd_bwd_ms", "peak_gib"])
    if a.memory:
        mem = {}
        for T in (16384, 65536):
            B = 65536 // T
            xm = make_inputs(B, T, a.H, a.D)
            for name, (fn, ts) in cases(xm, a.D).items():
                if name in ("ours_fox", "ours_sympow2_gated", "ours_sympow4_gated"):
                    mem[f"{name} B={B} T={T}"] = measure(fn, ts)
                    print(name, B, T, mem[f"{name} B={B} T={T}"], flush=True)
            del xm
            torch.cuda.empty_cache()
        rows.update(mem)
        text += "\n\nB*T = 65,536 tokens:\n\n" + table(mem, ["fwd_ms", "fwd_bwd_ms", "peak_gib"])
    print(text)
    (out / "bench_attention.md").write_text(text + "\n")
    (out / "bench_attention.json").write_text(json.dumps({"setting": head, "config": ka.CONFIG, "rows": rows},
                                                         indent=1))
    if not a.sweep:
        plot({n: r for n, r in rows.items() if " T=" not in n}, out / "bench_attention.png")


if __name__ == "__main__":
    main()
