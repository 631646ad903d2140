"""Every kernel path the backbones call (FLA's and the project's decayed attention), against its PyTorch reference,
forward and backward, on a GPU.

    python benchmarks/kernel_check.py                    # B=2, H=8, D=64 at T=2048 and T=1000; prints a table
    python benchmarks/kernel_check.py --T 512 --json out.json
    python benchmarks/kernel_check.py --B 4 --T 4096 --H 16 --D 64 128 --kernels fox alibi sympow2_gated sympow4_gated

Inputs are bf16 (gates, w and beta in fp32, as the kernels want); the reference runs on the same values upcast to
fp32. Errors are ||kernel - ref|| / ||ref|| for the output and for every input gradient. tests/test_gpu.py runs the
same checks at small shapes under `pytest -m gpu`.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from duality.kernels.attention import decayed_attention  # noqa: E402
from duality.kernels.path_attention import path_attention, path_attention_reference  # noqa: E402
from duality.kernels.recurrences import delta_rule, delta_rule_recurrent, gated, gated_chunked, oja, oja_recurrent  # noqa: E402
from duality.model.pe.alibi import alibi_slopes  # noqa: E402


def _inputs(name, B, T, H, D, device):
    g = torch.Generator(device="cpu").manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    q, k, v = r(B, T, H, D), r(B, T, H, D), r(B, T, H, D)
    x = {"q": q.bfloat16(), "k": k.bfloat16(), "v": v.bfloat16()}
    if name in ("delta_rule", "gated_delta_rule"):
        x["k"] = F.normalize(k, dim=-1).bfloat16()
        x["q"] = F.normalize(q, dim=-1).bfloat16()
        x["beta"] = torch.sigmoid(r(B, T, H))
    if name == "gated_delta_rule":
        x["g"] = -F.softplus(r(B, T, H) - 2)
    if name == "gla":
        x["g"] = F.logsigmoid(r(B, T, H, D)) / 16
    if name == "simple_gla":
        x["g"] = F.logsigmoid(r(B, T, H, 1) + 3)
    if name == "oja":
        x["v"] = F.normalize(v, dim=-1).bfloat16()
        x["gv"] = F.logsigmoid(r(B, T, H, D)) / 16
        x["beta"] = torch.sigmoid(r(B, T, H))
    if name in ("fox", "fla_fox", "sympow2_gated", "sympow4_gated"):
        x["f"] = F.logsigmoid(r(B, T, H) + 3)
    if name == "alibi":
        x["m"] = alibi_slopes(H).to(device)  # not a tensor that needs a gradient
    if name in ("path", "path_fox"):
        x["w"] = F.normalize(r(B, T, H, D), dim=-1)
        x["beta"] = 2 * torch.sigmoid(r(B, T, H))
    if name == "path_fox":
        x["f"] = F.logsigmoid(r(B, T, H) + 3)
    return x


def _run(name, x, reference: bool):
    s = x["q"].shape[-1] ** -0.5
    if name in ("gla", "simple_gla"):
        return (gated_chunked if reference else gated)(x["q"], x["k"], x["v"], x["g"], s)[0]
    if name in ("delta_rule", "gated_delta_rule"):
        f = delta_rule_recurrent if reference else delta_rule
        return f(x["q"], x["k"], x["v"], x["beta"], s, x.get("g"))[0]
    if name == "oja":
        return (oja_recurrent if reference else oja)(x["q"], x["k"], x["v"], x["gv"], x["beta"], s)[0]
    if name == "fla_fox" and not reference:
        from fla.ops.forgetting_attn import parallel_forgetting_attn
        return parallel_forgetting_attn(x["q"], x["k"], x["v"], x["f"])
    if name in ATTENTION or name == "fla_fox":
        f = x.get("f")
        return decayed_attention(x["q"], x["k"], x["v"], log_decay=None if f is None else torch.cumsum(f, 1),
                                 slopes=x.get("m"), power=ATTENTION.get(name), impl="torch" if reference else "triton")
    if name in ("path", "path_fox"):
        f = x.get("f")
        if reference:
            c = None if f is None else torch.cumsum(f, 1)
            return path_attention_reference(x["q"], x["k"], x["v"], x["w"], x["beta"], c)
        return path_attention(x["q"], x["k"], x["v"], x["w"], x["beta"], f)
    raise ValueError(name)


ATTENTION = {"softmax": None, "fox": None, "alibi": None, "sympow2": 2, "sympow2_gated": 2, "sympow4_gated": 4}
KERNELS = ("gla", "simple_gla", "delta_rule", "gated_delta_rule", "oja", *ATTENTION, "path", "path_fox")


def check(name, B=2, T=2048, H=8, D=64, device="cuda", verbose=False) -> dict:
    """Relative errors of output and input gradients, kernel vs fp32 reference."""
    import time
    x = _inputs(name, B, T, H, D, device)
    xk = {n: t.clone().requires_grad_(n != "m") for n, t in x.items()}
    xr = {n: t.detach().float().clone().requires_grad_(n != "m") for n, t in x.items()}
    do = torch.randn(B, T, H, D, device=device)
    t0 = time.time()
    ok = _run(name, xk, False)
    ok.float().mul(do).sum().backward()
    torch.cuda.synchronize() if device == "cuda" else None
    t1 = time.time()
    orf = _run(name, xr, True)
    orf.mul(do).sum().backward()
    torch.cuda.synchronize() if device == "cuda" else None
    if verbose:
        print(f"  [{name} T={T}: kernel fwd+bwd (incl. compile) {t1 - t0:.1f}s, reference {time.time() - t1:.1f}s]",
              flush=True)

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()

    out = {"o": rel(ok, orf)}
    for n in x:
        if x[n].is_floating_point() and xk[n].grad is not None:
            out["d" + n] = rel(xk[n].grad, xr[n].grad)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, nargs="+", default=[2048, 1000])
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--D", type=int, nargs="+", default=[64])
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS))
    ap.add_argument("--json")
    a = ap.parse_args()
    import triton
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    rows = []
    for T, D, name in itertools.product(a.T, a.D, a.kernels):
        where = {"kernel": name, "B": a.B, "T": T, "H": a.H, "D": D}
        try:
            err = check(name, B=a.B, T=T, H=a.H, D=D, verbose=True)
            rows.append({**where, **err})
            print(f"{name:18s} T={T:5d} D={D:3d} " + " ".join(f"{k}={v:.1e}" for k, v in err.items()), flush=True)
        except Exception as e:  # report and go on: one refusal (e.g. fla issue #640) must not hide the rest
            rows.append({**where, "error": f"{type(e).__name__}: {e}"[:300]})
            print(f"{name:18s} T={T:5d} D={D:3d} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
        torch.cuda.empty_cache()
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
