"""AdamW with decay groups, the learning-rate schedules, and one optimizer step over accumulated micro-batches."""

from __future__ import annotations

import math
import warnings
from contextlib import nullcontext

import torch

from .runtime import training_backends

SCHEDULES = ("cosine", "wsd", "linear", "constant")


def lr_lambda(o, total: int):
    """The multiplier of optim.lr at each step: linear warmup, then cosine / WSD / linear / constant."""
    warm = int(o.warmup * total) if o.warmup < 1 else int(o.warmup)
    lo = o.min_lr_ratio

    def f(step):
        if step < warm:
            return (step + 1) / (warm + 1)
        if o.schedule == "cosine":
            p = (step - warm) / max(1, total - warm)
            return lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * min(p, 1.0)))
        if o.schedule == "linear":
            return 1.0 - (1 - lo) * min(1.0, (step - warm) / max(1, total - warm))
        if o.schedule == "wsd":
            start = total - int(o.decay_fraction * total)
            return 1.0 if step < start else 1.0 - (1 - lo) * min(1.0, (step - start) / max(1, total - start))
        return 1.0
    return f


def make_optimizer(model, o, fused: bool):
    """Decay matrices (and embeddings); never norms, biases or other vectors."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": o.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps, fused=fused)


def make_schedule(optimizer, o, total: int):
    """The schedule laid out over `total` steps (its `horizon`, which checkpoints keep: schedule_horizon)."""
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(o, total))
    scheduler.horizon = total
    return scheduler


def train_step(train_model, micro_batches, accum: int, optimizer, scheduler, autocast, grad_clip: float | None,
               skip_sync=None, guard=None):
    """One optimizer step over `accum` micro-batches (an iterable of device tensors x, y, and optionally the model's
    keyword arguments: cu_seqlens, cp_group): gradients accumulate
    (under `skip_sync()` the gradient reduction across ranks waits for the last one), are clipped, and the optimizer
    and schedule advance. Returns the mean loss and the gradient norm as device tensors, and whether the optimizer
    stepped: `guard(loss, grad_norm) -> bool` decides that, with the gradients still in place (trainer/guard.py);
    without a guard nothing here waits for the GPU."""
    loss_sum = 0.0
    for micro, (x, y, *kw) in enumerate(micro_batches):  # (x, y) or (x, y, {model kwargs})
        sync = skip_sync() if skip_sync is not None and micro < accum - 1 else nullcontext()
        kw = kw[0] if kw else {}
        # the backward inside both contexts: FSDP2 reads its no-sync flags in backward (outside, every micro-batch
        # reduce-scattered its gradients and re-sharded), and activation checkpointing's recompute must pick the
        # forward's SDPA kernel (cuDNN's and flash's saved log-sum-exp shapes differ; torch.utils.checkpoint refuses)
        with sync, training_backends():
            with autocast:
                _, loss = train_model(x, y, **kw)
            (loss / accum).backward()
        loss_sum = loss_sum + loss.detach() / accum
    # grad_clip null: the norm is still computed (for the log and the non-finite check), nothing is clipped
    grad_norm = torch.nn.utils.clip_grad_norm_(train_model.parameters(), math.inf if grad_clip is None else grad_clip)
    if hasattr(grad_norm, "full_tensor"):  # FSDP: a replicated DTensor
        grad_norm = grad_norm.full_tensor()
    stepped = guard is None or guard(loss_sum, grad_norm)
    if stepped:
        optimizer.step()
    with warnings.catch_warnings():
        if not stepped:  # the schedule moves on past a skipped step (guard.py): not the misuse torch warns about
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm, stepped
