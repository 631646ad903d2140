"""How far each model.mlp_impl's SwiGLU is from float64: its output and its three gradients (input, W_13, W_2) under
bf16 autocast, each against float64 arithmetic on the same bf16-rounded inputs and weights. A training curve that
drifts with one impl (docs/throughput: quack's loss check) asks first whether the layer itself is less exact.

Per tensor: rel = |g - r| / |r| (Frobenius), bias = <g - r, r> / |r|^2 (a shrink or a growth along the reference),
and the largest difference between two calls of the same impl (0: deterministic).

    python benchmarks/mlp_numerics.py --impls inductor quack --shapes 2x4096 8x4096 --out numerics.json   # a GPU
    python benchmarks/mlp_numerics.py --impls inductor --d-model 64 --hidden 176 --shapes 2x32             # the CPU
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from duality.model.core.layers import MLP_IMPLS, quack_available
from duality.model.gpt import SwiGLU

NAMES = ("y", "dx", "dW13", "dW2")


def reference(x, dy, w13, w2):
    """float64 on the bf16-rounded tensors an autocast step multiplies: y = (silu(x W_1) * x W_3) W_2 and its grads."""
    x, w13, w2 = (t.detach().to(torch.bfloat16).double().requires_grad_() for t in (x, w13, w2))
    a, b = (x @ w13.T).chunk(2, -1)
    y = (F.silu(a) * b) @ w2.T
    y.backward(dy.double())
    return [y.detach(), x.grad, w13.grad, w2.grad]


def run(mlp, x, dy):
    x = x.clone().requires_grad_()
    mlp.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, torch.bfloat16):
        y = mlp(x)
    y.backward(dy.to(y.dtype))
    return [t.double() for t in (y, x.grad, mlp.w13.weight.grad, mlp.w2.weight.grad)]


def compare(impls, shape, d_model, hidden, device, seed=0) -> dict:
    """{impl: {tensor: {rel, bias, repeat}}} for one input shape (batch, seq)."""
    torch.manual_seed(seed)
    mlps = {impl: SwiGLU(d_model, hidden, impl).to(device) for impl in impls}
    first = next(iter(mlps.values()))
    for m in mlps.values():
        m.load_state_dict(first.state_dict())
    x = torch.randn(*shape, d_model, device=device)
    dy = (torch.randn(*shape, d_model, device=device) * 1e-3).to(torch.bfloat16)
    ref = reference(x, dy, first.w13.weight, first.w2.weight)
    out = {}
    for impl, m in mlps.items():
        g1, g2 = run(m, x, dy), run(m, x, dy)
        out[impl] = {name: {"rel": ((g - r).norm() / r.norm()).item(),
                            "bias": ((g - r) * r).sum().item() / r.square().sum().item(),
                            "repeat": (g - h).abs().max().item()}
                     for name, g, h, r in zip(NAMES, g1, g2, ref)}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impls", nargs="+", default=list(MLP_IMPLS), choices=MLP_IMPLS)
    p.add_argument("--shapes", nargs="+", default=["2x4096"], help="batch x sequence, e.g. 2x4096")
    p.add_argument("--d-model", type=int, default=1024)  # the 370m model's MLP
    p.add_argument("--hidden", type=int, default=2816)
    p.add_argument("--out", help="write the numbers here (JSON)")
    a = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if "quack" in a.impls and (device != "cuda" or not quack_available()):
        raise SystemExit("--impls quack needs a CUDA GPU and quack-kernels (pip install '.[quack]'); "
                         f"this machine: {device}, quack {'installed' if quack_available() else 'not installed'}")
    result = {}
    for s in a.shapes:
        shape = tuple(int(n) for n in s.split("x"))
        result[s] = compare(a.impls, shape, a.d_model, a.hidden, device)
        for impl, row in result[s].items():
            cells = (f"{n}: rel {v['rel']:.2e} bias {v['bias']:+.1e} repeat {v['repeat']:.0e}" for n, v in row.items())
            print(f"{s} {impl:9s} " + "  ".join(cells), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                                           "torch": torch.__version__, "command": " ".join(sys.argv),
                                           "d_model": a.d_model, "hidden": a.hidden, "result": result}, indent=1))
    return result


if __name__ == "__main__":
    main()
