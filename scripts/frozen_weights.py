"""Is a run still learning, or has the precision of its weights and optimizer state frozen it? Compares two
checkpoints of one run (train.py's: model and AdamW state keyed by parameter name):

    python scripts/frozen_weights.py RUN/checkpoints/step_0011700.pt RUN/checkpoints/step_0018600.pt
    (either may also be a checkpoints/ folder or a run's out_dir: its newest checkpoint, as resume=auto finds it)

Prints the share of weight entries that changed between them and, at the later one, the share whose next AdamW step
is under half the spacing of the weight's dtype there (rounding drops it), the median step, and the share of second
moments v that the decay v * beta2 leaves unchanged in the state's dtype.

Why: with the weights and AdamW state in bf16 (`train.dtype=bf16_weights`, as seed 004's code casts its model), the
decay by beta2 = 0.999 changes v by 0.1%, under half the gap between neighbouring bf16 numbers (0.2-0.4% of v), so
v never shrinks below the size of the largest gradients it has seen. Once the model fits and the gradients shrink,
m / sqrt(v) goes to ~0 and every step rounds away (docs/synthetic, "S2's extrapolation gap").
"""

from __future__ import annotations

import argparse

import torch

from duality.trainer.checkpoint import read_checkpoint


def spacing(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The distance from each |w| to the next number of `dtype` above it (the normal range)."""
    info = torch.finfo(dtype)
    w = w.float().abs().clamp_min(info.tiny)
    return torch.exp2(torch.floor(torch.log2(w))) * info.eps


def adamw_step(w: torch.Tensor, state: dict, group: dict) -> torch.Tensor:
    """|the update torch.optim.AdamW makes next| (its bias-corrected m / (sqrt(v) + eps) plus decoupled decay), as if
    the next gradient were zero: what the optimizer would move each entry by, computed in fp32."""
    beta1, beta2 = group["betas"]
    t = float(state["step"])
    m = state["exp_avg"].float() / (1 - beta1 ** t)
    v = state["exp_avg_sq"].float() / (1 - beta2 ** t)
    return group["lr"] * (m / (v.sqrt() + group["eps"]) + group["weight_decay"] * w.float()).abs()


def compare(before: dict, after: dict) -> dict:
    """Shares (0-1) over the floating-point weights: changed between the checkpoints; with a next AdamW step under
    half the dtype's spacing; with a second moment that decay leaves as it is (of the non-zero ones); and the median
    step."""
    a, b = before["model"], after["model"]
    names = [k for k, t in b.items() if torch.is_floating_point(t)]
    if missing := [k for k in names if k not in a or a[k].shape != b[k].shape]:
        raise SystemExit(f"the checkpoints are not of one model: {', '.join(missing[:5])} differ")
    total = sum(b[k].numel() for k in names)
    changed = sum((a[k] != b[k]).sum().item() for k in names)
    opt = after["optimizer"]
    group_of = {name: g for g in opt["param_groups"] for name in g["params"]}  # weight decay differs by group
    below = stuck = nonzero = counted = 0
    steps = []
    for name, state in opt["state"].items():
        if name not in b or "exp_avg_sq" not in state:
            continue
        group = group_of.get(name, opt["param_groups"][0])
        w, v = b[name], state["exp_avg_sq"]
        step = adamw_step(w, state, group)
        steps.append(step.flatten())
        below += (step < spacing(w, w.dtype) / 2).sum().item()
        counted += w.numel()
        stuck += ((v * group["betas"][1] == v) & (v != 0)).sum().item()
        nonzero += (v != 0).sum().item()
    if not counted:
        raise SystemExit("the later checkpoint has no AdamW state keyed by parameter name")
    return {"steps": (before.get("step"), after.get("step")), "changed": changed / total,
            "below_half_spacing": below / counted, "v_decay_no_op": stuck / max(nonzero, 1),
            "median_step": torch.cat(steps).median().item(), "lr": opt["param_groups"][0]["lr"],
            "dtypes": sorted({str(b[k].dtype) for k in names})}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    args = ap.parse_args()
    r = compare(read_checkpoint(args.before)[1], read_checkpoint(args.after)[1])
    print(f"steps {r['steps'][0]} -> {r['steps'][1]}, weights {', '.join(r['dtypes'])}, lr {r['lr']:.3g}")
    print(f"weight entries changed: {100 * r['changed']:.3f}%")
    print(f"next AdamW step under half the weight's spacing (rounded away): {100 * r['below_half_spacing']:.2f}%; "
          f"median step {r['median_step']:.3g}")
    print(f"second moments that v * beta2 leaves unchanged: {100 * r['v_decay_no_op']:.2f}%")


if __name__ == "__main__":
    main()
