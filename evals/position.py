"""Loss as a function of position, far past the training context (seed 003, Figure 2), and final loss as a function
of the training context (seed 003, Figure 1).

    loss(t) = mean over held-out windows w of  -log p(x^w_{t+1} | x^w_{<=t}),   t = 0 .. length-1

drawn in log-spaced position buckets (8 per octave), with avg_up_to[n] = mean_{t<n} loss(t), the average loss of
an evaluation context of n tokens. Long windows run through the model's cache in chunks of `chunk` tokens (the
incremental form every mixer has): a recurrent state stays constant in size, a KV cache grows, and no T x T score
matrix is built for more than `chunk` queries at a time.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from duality.common.plots import save_figure
from duality.model import Cache, ConfigError

MAX_LENGTH = 65536


def token_losses(model, x, y, chunk: int | None, autocast) -> torch.Tensor:
    """Per-token loss [B, T] in float32; chunked through the cache when T > chunk."""
    cache = Cache(len(model.blocks)) if chunk and x.shape[1] > chunk else None
    step = chunk if cache is not None else x.shape[1]
    out = []
    for s in range(0, x.shape[1], step):
        with autocast:
            logits, _ = model(x[:, s:s + step], cache=cache)
        out.append(F.cross_entropy(logits.float().transpose(1, 2), y[:, s:s + step], reduction="none"))
    return torch.cat(out, 1)


def choose_length(model, n_val_tokens: int, length: int | None) -> int:
    """The evaluation length: as asked, or the longest power of two the validation split holds (<= 65,536). A learned
    absolute embedding has no positions past the training context."""
    limit = getattr(model.abs_pe, "max_positions", None)
    if length is None:
        length = min(MAX_LENGTH, 2 ** int(math.log2(max(2, n_val_tokens - 1))), limit or MAX_LENGTH)
    if limit and length > limit:
        raise ConfigError(f"position_loss.length={length}: pe=learned has positions 0..{limit - 1} only "
                          f"(the training context); choose length <= {limit}")
    if length + 1 > n_val_tokens:
        raise ConfigError(f"position_loss.length={length} needs {length + 1} validation tokens; the data has "
                          f"{n_val_tokens:,} (lower position_loss.length or evaluate on more data: data=text ...)")
    return length


@torch.no_grad()
def position_loss(model, tok, data_cfg, length: int | None, max_windows: int, micro_batch: int, chunk: int | None,
                  device, autocast) -> dict:
    from duality import data as data_lib
    info = data_lib.prepare(data_cfg, progress=False, tokenizer=tok)
    length = choose_length(model, info.n_val_tokens, length)
    windows = info.windows("val", length, shuffle=False)
    n = min(len(windows), max_windows)
    total = torch.zeros(length, dtype=torch.float64)
    for i in tqdm(range(0, n, micro_batch), desc=f"position_loss T={length}", unit="batch", leave=False):
        x, y = windows.batch(range(i, min(n, i + micro_batch)))
        total += token_losses(model, x.to(device), y.to(device), chunk, autocast).double().sum(0).cpu()
    loss = (total / n).numpy()
    edges = np.unique(np.round(2 ** np.arange(0, math.log2(length) + 1e-9, 1 / 8)).astype(int))
    edges = np.append(edges[edges < length], length)  # bucket k: positions [edges[k], edges[k+1])
    buckets = [(int(a), float(loss[a - 1:b - 1].mean())) for a, b in zip(edges[:-1], edges[1:])]  # 1-based
    avg = {int(m): float(loss[:m].mean()) for m in 2 ** np.arange(int(math.log2(length)) + 1)}
    if length not in avg:
        avg[length] = float(loss.mean())
    return {"length": length, "windows": n, "tokens": n * length, "mean_loss": float(loss.mean()),
            "positions": [p for p, _ in buckets], "loss": [v for _, v in buckets], "avg_up_to": avg}


def plot_position_loss(curves: dict[str, dict], path: Path, title: str = "") -> Path | None:
    """curves: label -> position_loss() result plus its 'train_len'. Log-x; dashed lines at the training contexts."""
    def draw(axes):
        ax = axes[0]
        for n, (label, c) in enumerate(curves.items()):
            ax.plot(c["positions"], c["loss"], color=f"C{n}", label=label)
            ax.axvline(c["train_len"], color=f"C{n}", ls="--", lw=1, alpha=0.7)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="position in the evaluation sequence (tokens)", ylabel="next-token loss (nats)",
               title=title or "loss by position (dashed: training context)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(path, draw, figsize=(7, 4.2))


def plot_loss_vs_context(points: dict[str, list[tuple[int, float]]], path: Path) -> Path | None:
    """points: backbone + scheme -> [(training context, validation loss), ...] (seed 003, Figure 1)."""
    def draw(axes):
        ax = axes[0]
        for label, pts in points.items():
            pts = sorted(pts)
            ax.plot([p for p, _ in pts], [v for _, v in pts], "o-", label=label)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="training context (tokens)", ylabel="validation loss at the training context",
               title="loss vs training context")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(path, draw, figsize=(6, 4))
