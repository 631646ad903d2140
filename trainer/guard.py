"""The non-finite guard: every step's loss and gradient norm are checked before the optimizer step, so a NaN or inf
never reaches the weights or the optimizer state.

    train.nonfinite=stop   checkpoint the last good state (the weights before this step), write nonfinite.json in the
                           run's folder (the step, its loss and gradient norm, where, the message), stop with an error
    train.nonfinite=skip   drop this step's gradients, leave weights and optimizer state as they were (the data and
                           the learning-rate schedule move on), count it (`nonfinite_skipped` in the logs), go on

Either way the message names the step and where the values went bad: the micro-batches of the step are run again
through the plain model with a forward hook on every module, and the first module (in execution order, so the
innermost) whose output is not finite is named with its block; when the forward is finite everywhere, the
backward went bad, and the parameters whose gradients are not finite are named instead.

The check costs one host-device synchronisation per step (the flag is reduced over ranks first): the host no longer
queues the next step's kernels while the GPU finishes this one. Not measured apart: bench_train.py times
train_step without a guard.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from duality.common.errors import NonFinite
from duality.common.io import write_atomic

MODES = ("stop", "skip")


def _not_finite(out) -> bool:
    tensors = out if isinstance(out, (tuple, list)) else (out,)
    for t in tensors:
        if torch.is_tensor(t) and t.is_floating_point():
            local = t.to_local() if hasattr(t, "to_local") else t
            if not torch.isfinite(local).all():
                return True
    return False


def first_nonfinite_output(model, micro_batches, autocast) -> str | None:
    """The first module whose forward output is not finite, over the micro-batches (x, y[, model kwargs]) in order:
    e.g. "blocks.3.mixer.o_proj (Linear) in block 3 of 12, micro-batch 0"; None when every output is finite. Every
    micro-batch is run whatever is found, so that ranks of a sharded model (FSDP) take part in the same collectives."""
    found: list[str] = []
    micro = [0]
    n_blocks = len(getattr(model, "blocks", ()))

    def hook(name):
        def fn(module, args, out):
            if not found and _not_finite(out):
                block = re.match(r"blocks\.(\d+)", name)
                where = f" in block {block.group(1)} of {n_blocks}" if block else ""
                found.append(f"{name or 'the model'} ({type(module).__name__}){where}, micro-batch {micro[0]}")
        return fn

    handles = [m.register_forward_hook(hook(name)) for name, m in model.named_modules()]
    try:
        with torch.no_grad():
            for micro[0], (x, y, *kw) in enumerate(micro_batches):
                with autocast:
                    model(x, y, **(kw[0] if kw else {}))
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None


def nonfinite_gradients(model, limit: int = 3) -> list[str]:
    """The names of the (first `limit`, in model order) parameters whose gradient is not finite on this rank."""
    names = []
    for name, p in model.named_parameters():
        if p.grad is not None and _not_finite(p.grad):
            names.append(name)
            if len(names) == limit:
                break
    return names


class NonFiniteGuard:
    """train_step's `guard`: says whether the step may be taken; on a non-finite step it diagnoses, then stops
    (raising NonFinite after checkpointing the last good state) or skips."""

    def __init__(self, mode: str, rt, model, objective, saver, say, start: int, wandb_id: str | None = None,
                 out_dir: Path | None = None):
        """start: the step this process began at (its state is already on disk, or the initial model); out_dir: where
        a stop leaves nonfinite.json (a sweep's launcher and the results grid read it: a diverged run is an outcome,
        not a job to run again)."""
        self.mode, self.rt, self.model, self.objective = mode, rt, model, objective
        self.saver, self.say, self.start, self.wandb_id, self.out_dir = saver, say, start, wandb_id, out_dir

    def __call__(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
        """step: the 0-based index of the step about to be taken (the state holds `step` steps)."""
        rt = self.rt
        if rt.all_finite([loss, grad_norm]):
            return True
        where = self.diagnose(step)
        what = f"step {step + 1}: loss {loss.item():.4g}, gradient norm {grad_norm.item():.4g} ({where})"
        if self.mode == "skip":
            self.saver.nonfinite_skipped += 1  # the count lives in the checkpoints
            self.say(step + 1, f"{what}: skipped (train.nonfinite=skip), the weights are those of step {step}")
            return False
        if step > self.start:  # the weights before this step: the last good state
            self.saver.save(step, wandb_id=self.wandb_id)
        message = (f"{what}; the weights were not updated. The last good state is "
                   f"{self.saver.last_good or 'the initial model'}"
                   + (" (resume=auto continues from it)" if self.saver.last_good else "")
                   + "; train.nonfinite=skip skips such steps; a lower optim.lr, longer optim.warmup or "
                   "optim.grad_clip may help")
        if self.out_dir is not None and rt.master:
            write_atomic(Path(self.out_dir) / "nonfinite.json", json.dumps(
                {"step": step + 1, "loss": loss.item(), "grad_norm": grad_norm.item(), "where": where,
                 "message": message}, indent=1))
        raise NonFinite(message)

    def diagnose(self, step: int) -> str:
        """Where it went bad, from every rank: the first non-finite forward output of this step's micro-batches, else
        the parameters with non-finite gradients."""
        grads = nonfinite_gradients(self.model)
        first = first_nonfinite_output(self.model, self.objective.micro_batches(step), self.rt.autocast)
        mine = (f"first non-finite output: {first}" if first else
                f"the forward is finite; non-finite gradients in {', '.join(grads)}" if grads else
                "the forward and this rank's gradients are finite")
        reports = self.rt.gather_objects(mine)
        if len(reports) == 1:
            return reports[0]
        return "; ".join(f"rank {r}: {m}" for r, m in enumerate(reports))
