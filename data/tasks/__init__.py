"""Synthetic tasks as data sources: `data=mqar`, `data=copying`, `data=parity|a3|s3`, `data=mad_<task>`,
`data=retrieval`.

Every task is generated from `data.seed` alone (no downloads, nothing on disk) and becomes a TaskData:

    train   Examples: inputs [N, T] and targets [N, T] (-1 = no loss there), read in a seeded order per epoch by the
            same TrainBatches that reads text, so DDP, resume and gradient accumulation work unchanged
    evals   EvalSets: blocks of equal-length examples, each adding points to the accuracy-vs-length curve
    symbols the name of every token (a `symbols` tokenizer: eval.py samples from prompts like "b a c <copy>")

Loss and accuracy count only positions whose target is >= 0. A task's `train_len` is the longest length (in the
curve's unit: sequence, string or prefix length) seen in training; evaluation reports accuracy up to it
(`val_acc`) and beyond it (`val_acc_extrap`), and the whole curve (out_dir/task_eval.json, accuracy_vs_length.png).
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from duality.common.errors import ConfigError
from duality.common.plots import save_figure

from ..shards import EpochOrder, rank_batches


@dataclass
class EvalSet:
    inputs: np.ndarray  # [n, T]
    targets: np.ndarray  # [n, T], -1: no loss, not scored
    length: int  # the x of this set on the accuracy-vs-length curve (copying: string length; MQAR: sequence length)
    per_position: bool = False  # state tracking: position first + t - 1 is the prefix of length t, one point each
    first: int = 0  # per_position: tokens before the first scored position (a <bos>)
    exact: bool = False  # copying: an example is right only if every scored token is
    family: np.ndarray | None = None  # exact sets: each example's index into `families`, scored apart as well
    families: tuple[str, ...] = ()  # (retrieval: passkey, niah_single, ...; evaluate's curve_family)


@dataclass
class TaskData:
    name: str
    train: "Examples"
    evals: list[EvalSet]
    symbols: list[str]
    train_len: int
    seq_len: int  # T of the training inputs
    unit: str = "sequence length"  # the curve's x axis
    head: str = "lm"  # lm: next-token logits at every position | compress: the sequence decoded from the last state
    info: dict = field(default_factory=dict)


class Examples:
    """A fixed set of examples in a seeded order per epoch: the contract of data.shards.TokenWindows."""

    def __init__(self, inputs: np.ndarray, targets: np.ndarray, seed: int = 0, shuffle: bool = True):
        assert inputs.shape == targets.shape and inputs.ndim == 2
        self.inputs, self.targets = inputs, targets
        self.order = EpochOrder(len(inputs), seed, shuffle)

    def __len__(self):
        return len(self.inputs)

    def batch(self, sample_ids):
        idx = np.array([self.order(int(g)) for g in sample_ids])
        return (torch.from_numpy(self.inputs[idx].astype(np.int64)),
                torch.from_numpy(self.targets[idx].astype(np.int64)))


class Stream:
    """Fresh examples, none repeated: sample g is made from an rng drawn from (seed, g) alone, so resume, DDP
    ranks and gradient accumulation see the same data as with Examples; `make(rngs)` builds a batch's rows at
    once. len() is the nominal epoch (`train.epochs` counts passes of it); nothing is stored."""

    def __init__(self, make, n: int, seed: int = 0):
        self.make, self.n, self.seed = make, n, seed

    def __len__(self):
        return self.n

    def batch(self, sample_ids):
        x, y = self.make([rng_for(self.seed, "train", int(g)) for g in sample_ids])
        return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))


def compact(a: np.ndarray) -> np.ndarray:
    """The smallest signed integer type holding a (targets use -1)."""
    for t in (np.int8, np.int16, np.int32):
        if a.size == 0 or (a.min() >= np.iinfo(t).min and a.max() <= np.iinfo(t).max):
            return a.astype(t)
    return a.astype(np.int64)


def options(cfg: dict, fn, what: str) -> dict:
    """The config's options for generator `fn` (its keyword-only parameters); unknown keys are an error."""
    params = inspect.signature(fn).parameters
    valid = {p for p, v in params.items() if v.kind == inspect.Parameter.KEYWORD_ONLY}
    given = {k: v for k, v in cfg.items() if k not in ("name", "cache_dir")}
    unknown = sorted(set(given) - valid)
    if unknown:
        raise ConfigError(f"data={what}: unknown option(s) {unknown}; valid options: {sorted(valid)}")
    return given


def rng_for(seed: int, split: str, *more: int) -> np.random.Generator:
    """Independent streams per split (and per eval block): the train and test examples never share draws."""
    return np.random.default_rng([seed, {"train": 0, "test": 1, "map": 2}[split], *more])


# --------------------------------------------------------------------------------------------------- registry
def _registry():
    from . import copying, mad, mqar, retrieval, state_tracking
    return {"mqar": mqar.build, "copying": copying.build, "state_tracking": state_tracking.build, "mad": mad.build,
            "retrieval": retrieval.build}


def is_task(data_cfg) -> bool:
    return dict(data_cfg).get("name") in _registry()


def build(data_cfg) -> TaskData:
    cfg = dict(data_cfg)
    return _registry()[cfg["name"]](cfg)


# ------------------------------------------------------------------------------------------------- evaluation
# what a task evaluation reports (task_eval.json, a sweep's results.csv): the loss, and each accuracy up to the
# training length and beyond it, per position, per sequence (all right) and per letter (copying)
SCORES = ("val_loss", "val_acc", "val_acc_extrap", "val_seq_acc", "val_seq_acc_extrap", "val_char_acc",
          "val_char_acc_extrap")
EVAL_TOKENS = 65536  # tokens per evaluation forward: MQAR's 8192-way logits at 512 x 256 took 15 GB with the loss


@torch.no_grad()
def evaluate(model, task: TaskData, micro_batch: int, device, autocast=None, rank: int = 0, world: int = 1) -> dict:
    """Loss and accuracy on every eval set (examples split across ranks, summed with all_reduce).

    Returns val_loss, val_acc (lengths <= train_len), val_acc_extrap (lengths > train_len, if any) and
    curve {length: accuracy}. Per-position sets (state tracking) also give the seed's sequence accuracy:
    curve_seq {L: share of sequences right at every position up to L}, val_seq_acc (L = train_len) and
    val_seq_acc_extrap (L = the longest evaluated). Exact sets (copying; curve: strings right) also give the
    seed's code's character accuracy: curve_char {L: share of the copied letters right, <eos> not counted},
    val_char_acc and val_char_acc_extrap. Exact sets whose examples name a family (retrieval) give curve_family
    {family: {L: share right}} too."""
    was_training = model.training
    model.eval()
    autocast = autocast or nullcontext()
    points = sorted({p for s in task.evals
                     for p in (range(1, s.inputs.shape[1] - s.first + 1) if s.per_position else [s.length])})
    col = {p: i for i, p in enumerate(points)}
    tally = torch.zeros(len(points), 3, dtype=torch.float64, device=device)  # [right, total, sequences right so far]
    chars = torch.zeros(len(points), 2, dtype=torch.float64, device=device)  # exact sets: [letters right, letters]
    loss_sum = torch.zeros(2, dtype=torch.float64, device=device)  # [sum of token losses, scored tokens]
    families = list(dict.fromkeys(f for s in task.evals for f in s.families))
    by_family = torch.zeros(len(points), max(1, len(families)), 2, dtype=torch.float64, device=device)  # [right, n]
    for s in task.evals:
        rows = max(1, min(micro_batch, EVAL_TOKENS // s.inputs.shape[1]))
        for b in rank_batches(len(s.inputs), rank, world, rows):
            x = torch.from_numpy(s.inputs[b or [0]].astype(np.int64)).to(device)
            y = torch.from_numpy(s.targets[b or [0]].astype(np.int64)).to(device)
            with autocast:
                logits, _ = model(x)
            if not b:  # none left on this rank: a forward with the others (FSDP2 gathers in it), not counted
                continue
            mask = y >= 0
            # fp32 for the scored positions only (MQAR scores 1 in 16): a full fp32 copy of the logits was the
            # largest allocation of an MQAR evaluation; argmax is the same on the bf16 logits' exact fp32 values
            scored = logits[mask].float()
            loss_sum[0] += F.cross_entropy(scored, y[mask], reduction="sum")
            loss_sum[1] += mask.sum()
            right = torch.zeros_like(mask)
            right[mask] = scored.argmax(-1) == y[mask]
            if s.per_position:
                right, mask = right[:, s.first:], mask[:, s.first:]
                idx = torch.tensor([col[p] for p in range(1, y.shape[1] - s.first + 1)], device=device)
                all_right = (right | ~mask).cumprod(1)  # every scored position up to here right
                tally[:, 0].index_add_(0, idx, right.sum(0).double())
                tally[:, 1].index_add_(0, idx, mask.sum(0).double())
                tally[:, 2].index_add_(0, idx, (all_right & mask).sum(0).double())
            elif s.exact:
                ok = (right.sum(1) == mask.sum(1)) & (mask.sum(1) > 0)
                tally[col[s.length], :2] += torch.stack([ok.sum(), torch.tensor(len(b), device=device)]).double()
                letters = mask & (mask.cumsum(1) < mask.sum(1, keepdim=True))  # every scored token but the last
                chars[col[s.length]] += torch.stack([(right & letters).sum(), letters.sum()]).double()
                if s.family is not None:
                    fam = torch.tensor([families.index(s.families[i]) for i in s.family[b]], device=device)
                    by_family[col[s.length], :, 0].index_add_(0, fam, ok.double())
                    by_family[col[s.length], :, 1].index_add_(0, fam, torch.ones_like(fam, dtype=torch.float64))
            else:
                tally[col[s.length], :2] += torch.stack([right.sum(), mask.sum()]).double()
    if world > 1:
        import torch.distributed as dist
        dist.all_reduce(tally)
        dist.all_reduce(loss_sum)
        dist.all_reduce(chars)
        dist.all_reduce(by_family)
    if was_training:
        model.train()
    tally, loss_sum, chars, by_family = (t.cpu().numpy() for t in (tally, loss_sum, chars, by_family))
    keep = tally[:, 1] > 0
    curve = {p: float(tally[i, 0] / tally[i, 1]) for i, p in enumerate(points) if keep[i]}
    lengths = np.array(points)
    inside, outside = keep & (lengths <= task.train_len), keep & (lengths > task.train_len)
    out = {"val_loss": float(loss_sum[0] / max(loss_sum[1], 1)),
           "val_acc": float(tally[inside, 0].sum() / max(tally[inside, 1].sum(), 1)) if inside.any() else None}
    if outside.any():
        out["val_acc_extrap"] = float(tally[outside, 0].sum() / tally[outside, 1].sum())
    if any(s.per_position for s in task.evals):
        seq = {p: float(tally[i, 2] / tally[i, 1]) for i, p in enumerate(points) if keep[i]}
        out["val_seq_acc"] = seq.get(task.train_len, seq[max(seq)])
        if max(seq) > task.train_len:
            out["val_seq_acc_extrap"] = seq[max(seq)]
        out["curve_seq"] = seq
    if chars[:, 1].any():  # copying: the seed's code's character accuracy beside the string accuracy
        out["curve_char"] = {p: float(chars[i, 0] / chars[i, 1]) for i, p in enumerate(points) if chars[i, 1] > 0}
        for key, where in (("val_char_acc", inside), ("val_char_acc_extrap", outside)):
            if (chars[where, 1] > 0).any():
                out[key] = float(chars[where, 0].sum() / chars[where, 1].sum())
    if families:
        out["curve_family"] = {f: {p: float(by_family[i, j, 0] / by_family[i, j, 1]) for i, p in enumerate(points)
                                   if by_family[i, j, 1] > 0} for j, f in enumerate(families)}
    out["curve"] = curve
    return out


def headline(m: dict) -> float | None:
    """The accuracy that `train.stop_acc` compares: the longest evaluated sequences all right (state tracking, as
    the seed's code stops), else accuracy beyond the training length, else up to it."""
    for key in ("val_seq_acc_extrap", "val_seq_acc", "val_acc_extrap", "val_acc"):
        if m.get(key) is not None:
            return m[key]
    return None


def log_points(curve: dict, train_len: int) -> dict:
    """A few `val_acc@L` numbers for the training log and wandb. A long per-position curve is averaged over
    buckets (L - train_len/2, L]; a short curve is logged as it is."""
    if len(curve) <= 16:
        return {f"val_acc@{p}": a for p, a in curve.items()}
    step = max(1, train_len // 2)
    out, top = {}, max(curve)
    for end in range(step, top + step, step):
        vals = [a for p, a in curve.items() if end - step < p <= end]
        if vals:
            out[f"val_acc@{min(end, top)}"] = float(np.mean(vals))
    return out


def labelled_curves(label: str, m: dict) -> dict:
    """The curves of one evaluation for plot_curves: per position, (state tracking) every position up to L right
    and (copying) the share of letters right."""
    return {label: m["curve"], **({f"{label}, all right to L": m["curve_seq"]} if "curve_seq" in m else {}),
            **({f"{label}, letters": m["curve_char"]} if "curve_char" in m else {})}


def draw_curves(ax, curves: dict, train_len: int | None, unit: str, title: str = "") -> None:
    """Accuracy vs length on one matplotlib axis, a line per label, the training length dashed (the seed's figures).
    Curve keys may be ints or the strings JSON made of them."""
    for label, curve in curves.items():
        points = sorted((int(p), a) for p, a in curve.items())
        ax.plot([p for p, _ in points], [a for _, a in points], label=label,
                marker="o" if len(points) <= 24 else None, markersize=3)
    if train_len:
        ax.axvline(train_len, color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel(unit)
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot_curves(curves: dict, path, train_len: int | None, unit: str, title: str = "") -> None:
    """One figure of draw_curves (task_eval.json holds the numbers when matplotlib is missing)."""
    return save_figure(path, lambda axes: draw_curves(axes[0], curves, train_len, unit, title))


def summary(m: dict, task: TaskData) -> str:
    """`loss L | acc A | acc beyond N B`: the line train.py and eval.py print after an evaluation."""
    acc = f"{m['val_acc']:.4f}" if m["val_acc"] is not None else "-"
    extrap = f" | acc beyond {task.train_len} {m['val_acc_extrap']:.4f}" if "val_acc_extrap" in m else ""
    seq = "".join(f" | all right to {L} {m[k]:.4f}" for k, L in
                  (("val_seq_acc", task.train_len), ("val_seq_acc_extrap", max(m.get("curve_seq") or [0]))) if k in m)
    chars = "".join(f" | {what} {m[k]:.4f}" for k, what in (("val_char_acc", "letters"),
                                                             ("val_char_acc_extrap", "letters beyond")) if k in m)
    return f"val loss {m['val_loss']:.4f} | acc {acc}{extrap}{seq}{chars}"
