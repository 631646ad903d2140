"""Does flash-linear-attention's PaTH attention fault in its backward at a shape? The minimal reproduction of the fault
docs/gpu records at seed 004's state-tracking and copying shapes on an H200 (an illegal memory access at the launch
of FLA's `intra_chunk_preprocess_bwd_kernel`): torch and FLA only, forward and backward of
`fla.ops.path_attn.parallel_path_attn` in bf16 as kernels/path_attention/fla.py calls it, each case in a process of
its own (the fault ends the CUDA context), so one run tells which of sequence length, head size, gate and pipelining
the fault follows. The last two cases call the repo's `path_attention`, which pads heads smaller than 64 with zeros
(the fix, as the cases before them show the fault to follow the head size).

    python reproductions/path_fault.py                          # every case below: ok, or the error's last line
    python reproductions/path_fault.py --case 256,129,12,32 --gate --json out.json

A GPU script (no CPU test: the fault is a GPU's). The repo's shipped kernel configs are seeded when the package is
importable (`--untuned`: not), so FLA's autotuned kernels time no configs first.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

# (B, T, H, D, gate, one pipeline stage, through the repo): the state-tracking workload docs/gpu names (256 sequences
# of 128 + <bos>, one layer of width 384 in 12 heads of 32), then one change at a time
CASES = [(256, 129, 12, 32, False, False, False),   # PaTH at the S2 shape
         (256, 129, 12, 32, True, False, False),    # PaTH-FoX at the S2 shape
         (256, 128, 12, 32, False, False, False),   # T a multiple of the chunk
         (256, 129, 12, 64, False, False, False),   # head size 64 (a head of 32 padded with zeros)
         (256, 128, 12, 64, False, False, False),   # both: MQAR's kind of shape, which trains
         (256, 129, 12, 32, False, True, False),    # num_stages 1 in the faulting kernel instead of Hopper's 3
         (8, 129, 12, 32, False, False, False),     # few sequences
         (256, 129, 12, 32, False, False, True),    # PaTH at the S2 shape through the repo (padded to 64)
         (256, 129, 12, 32, True, False, True)]     # PaTH-FoX likewise


def outcome(returncode: int, output: str) -> str:
    """A case's outcome from its process: its "ok" line, else the last line that names an error (a CUDA fault's
    traceback ends in advice such as "Search for `cudaErrorIllegalAddress' ..."), else the exit code and last line."""
    lines = output.strip().splitlines()
    if returncode == 0 and lines and lines[-1].startswith("ok"):
        return lines[-1]  # "ok", or "ok, but a gradient is not finite"
    last = f"exit {returncode}" + (f" after: {lines[-1]}" if lines else "")
    return next((x for x in reversed(lines) if re.match(r"[\w.]*(Error|Exception)\b", x)), last)


def child(b: int, t: int, h: int, d: int, gate: bool, stages1: bool, repo: bool, untuned: bool) -> None:
    import torch
    import torch.nn.functional as F
    if not untuned:
        try:
            import duality.kernels.tuned_configs  # noqa: F401
        except ImportError:
            pass
    if stages1:
        import fla.ops.path_attn.intra_chunk_preprocess_bwd as bwd
        bwd.check_shared_mem = lambda *a, **k: False
    from fla.ops.path_attn import parallel_path_attn

    torch.manual_seed(0)
    dev, bf16 = "cuda", torch.bfloat16
    q, k, v = (torch.randn(b, t, h, d, device=dev, dtype=bf16, requires_grad=True) for _ in range(3))
    w = F.normalize(torch.randn(b, t, h, d, device=dev), dim=-1).requires_grad_()
    beta = (2 * torch.rand(b, t, h, device=dev)).requires_grad_()
    g = F.logsigmoid(torch.randn(b, t, h, device=dev)).requires_grad_() if gate else None
    if repo:
        from duality.kernels.path_attention import path_attention
        o = path_attention(q, k, v, w, beta, g, d ** -0.5, "fla")  # g: a log gate (the repo scales it for FLA)
    else:
        o, _ = parallel_path_attn(q, k, v, w, beta, g, scale=d ** -0.5)
    o.float().square().sum().backward()
    torch.cuda.synchronize()
    grads = [x.grad for x in (q, k, v, w, beta, g) if x is not None]
    print("ok" if all(torch.isfinite(x).all() for x in grads) else "ok, but a gradient is not finite")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", help="B,T,H,D: this shape alone")
    ap.add_argument("--gate", action="store_true", help="with --case: PaTH-FoX's log gate")
    ap.add_argument("--stages1", action="store_true", help="with --case: one pipeline stage in the faulting kernel")
    ap.add_argument("--repo", action="store_true", help="with --case: through the repo's path_attention (padded)")
    ap.add_argument("--untuned", action="store_true", help="do not seed the repo's shipped kernel configs")
    ap.add_argument("--json", help="also write the outcomes here, with the versions and the GPU")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    cases = [(*map(int, a.case.split(",")), a.gate, a.stages1, a.repo)] if a.case else CASES
    if a.child:
        child(*cases[0], a.untuned)
        return 0
    out = []
    for b, t, h, d, gate, stages1, repo in cases:
        cmd = [sys.executable, __file__, "--child", "--case", f"{b},{t},{h},{d}"]
        cmd += ["--gate"] * gate + ["--stages1"] * stages1 + ["--repo"] * repo + ["--untuned"] * a.untuned
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            said = outcome(r.returncode, r.stdout + r.stderr)
        except subprocess.TimeoutExpired:
            said = "timed out after 600 s"
        case = {"B": b, "T": t, "H": h, "D": d, "gate": gate, "num_stages_1": stages1, "repo": repo,
                "outcome": said[:300]}
        out.append(case)
        print(f"B={b} T={t} H={h} D={d} gate={gate} stages1={stages1} repo={repo}: {case['outcome']}", flush=True)
    if a.json:
        import torch
        import triton
        from importlib.metadata import version
        meta = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None, "torch": torch.__version__,
                "triton": triton.__version__, "fla": version("flash-linear-attention"), "tuned": not a.untuned}
        with open(a.json, "w") as f:
            json.dump({**meta, "cases": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
