"""Where a model's training memory goes: every tensor autograd keeps for backward, by the module that saved it.

    python benchmarks/saved_activations.py --cases gla+nope fla:gla --setting 370m:4096
    python benchmarks/saved_activations.py --cases gla+nope --set train.activation_checkpointing=selective
    python benchmarks/saved_activations.py --cases retnet+nope --setting tiny:64 --like-fla   # on a CPU, as on a GPU

One eager forward (bf16 autocast, the device's) of one micro-batch of random tokens, under
`torch.autograd.graph.saved_tensors_hooks`: each saved tensor is attributed to the innermost module running when it
was saved, counted once per storage (a tensor saved by two ops, or views of one buffer, are one allocation), and
summed per module path with the block index dropped (`blocks.*.mixer.in_proj`), so a row is the total over all
layers. The table lists the largest rows per case, and the totals next to the parameter and gradient memory.
Compiled models save differently (Inductor's partitioner recomputes cheap ops), so this explains the eager peak and
points at what to fuse or recompute; bench_train.py measures the peaks.

Cases: those of bench_train.py (this repo's backbone + scheme, `ref`, and FLA's own models `fla:*`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_train  # noqa: E402


@contextmanager
def fla_like_kernels():
    """Within it, on a CPU, the recurrences and the short convolution treat their inputs as FLA's GPU kernels do, so
    that what autograd keeps can be counted without a GPU (forward only: the stand-ins have no backward). The
    recurrences keep contiguous copies of their inputs (FLA's input_guard), causal_conv1d keeps x as given, and
    both break a compiled graph. Yields the count of stand-in calls ({"recurrence": n, "conv": n}), so a caller can
    tell that they ran, and of the inputs the recurrences had to copy ("copied": not contiguous)."""
    from duality.model.core import layers
    from duality.model.mixers.base import Mixer
    calls = {"recurrence": 0, "conv": 0, "copied": 0}

    def copying(parallel):
        class Kernel(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *args):
                calls["copied"] += sum(torch.is_tensor(a) and not a.is_contiguous() for a in args)
                args = [a.contiguous() if torch.is_tensor(a) else a for a in args]
                ctx.save_for_backward(*[a for a in args if torch.is_tensor(a)])
                return parallel(*args)[0]

        @torch._dynamo.disable
        def call(*args, **kw):
            calls["recurrence"] += 1
            return Kernel.apply(*args), None
        return call

    conv = layers.ShortConv.forward

    class KeepsX(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, module, c, name):
            ctx.save_for_backward(x, w)
            return conv(module, x, c, name)

    @torch._dynamo.disable
    def conv_keeping_x(self, x, ctx=layers.TRAINING, name="conv"):
        calls["conv"] += 1
        return KeepsX.apply(x, self.weight, self, ctx, name)

    # every recurrent mixer runs its kernel through Mixer.recurrence: the one place to swap it
    recurrence = Mixer.__dict__["recurrence"]

    def recurrence_like_fla(parallel, step, args, ctx):
        return recurrence.__func__(copying(parallel), step, args, ctx)

    try:
        Mixer.recurrence = staticmethod(recurrence_like_fla)
        layers.ShortConv.forward = conv_keeping_x
        yield calls
    finally:
        Mixer.recurrence = recurrence
        layers.ShortConv.forward = conv


def saved_by_module(model, x, y, autocast, stand_ins=nullcontext(), backward=True) -> tuple[dict[str, dict], float]:
    """{module path (block index as *): {"bytes", "count", "shapes" (a few examples)}}, and the loss."""
    stack: list[str] = []
    names = {m: re.sub(r"\.\d+(?=\.|$)", ".*", n) or "(model)" for n, m in model.named_modules()}
    def enter(mod, args):
        stack.append(names[mod])

    def leave(mod, args, out):  # returns None: the output stays as it is
        stack.pop()

    handles = []
    for m in model.modules():
        handles += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
    seen, rows = set(), defaultdict(lambda: {"bytes": 0, "count": 0, "shapes": []})

    def pack(t):
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in seen and t.device.type != "meta":
            seen.add(key)
            r = rows[stack[-1] if stack else "(outside modules)"]
            r["bytes"] += storage.nbytes()
            r["count"] += 1
            if len(r["shapes"]) < 3:
                r["shapes"].append(f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}")
        return t

    try:
        with stand_ins, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
            _, loss = model(x, y)
    finally:
        for h in handles:
            h.remove()
    if backward:  # the stand-ins have none
        loss.backward()
    return dict(rows), loss.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", required=True)
    ap.add_argument("--setting", default="370m:4096", help="size:context (bench_train.py's settings)")
    ap.add_argument("--set", nargs="+", default=[], help="Hydra overrides for this repo's cases")
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--like-fla", action="store_true", help="on a CPU: the recurrences and convolution keep what "
                    "FLA's GPU kernels keep (fla_like_kernels), forward only")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = ap.parse_args()
    size, seq = args.setting.split(":")
    seq = int(seq)
    model_name, tokens, vocab = bench_train.SETTINGS.get(size, (size, 4 * seq, 512))  # e.g. tiny:64 on a CPU
    B = max(1, tokens // seq)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    autocast = torch.autocast(device, dtype=torch.bfloat16)
    result = {}
    for case in args.cases:
        torch.manual_seed(0)
        model, _, _ = bench_train.build(case, model_name, seq, vocab, args.set)
        model = model.to(device)
        x = torch.randint(0, vocab, (B, seq + 1), device=device)
        rows, loss = saved_by_module(model, x[:, :-1], x[:, 1:], autocast,
                                     fla_like_kernels() if args.like_fla else nullcontext(), backward=not args.like_fla)
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        total = sum(r["bytes"] for r in rows.values())
        result[case] = {"saved_gib": total / 2 ** 30, "params_gib": params / 2 ** 30, "loss": loss, "rows": rows}
        print(f"\n{case} {size}/{seq}, {B} x {seq} tokens: saved for backward {total / 2 ** 20:,.2f} MiB "
              f"(parameters {params / 2 ** 20:,.2f} MiB; gradients the same; AdamW twice that)")
        print("| module (all layers) | MiB | tensors | e.g. |\n|---|---:|---:|---|")
        for name, r in sorted(rows.items(), key=lambda kv: -kv[1]["bytes"])[:args.top]:
            print(f"| {name} | {r['bytes'] / 2 ** 20:,.0f} | {r['count']} | {'; '.join(r['shapes'][:2])} |")
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps({"setting": args.setting, "device": torch.cuda.get_device_name()
                                        if device == "cuda" else "cpu", "cases": result}, indent=1))


if __name__ == "__main__":
    main()
