"""What a run trains toward and how it is scored. The loop asks an objective for its batches, calls `evaluate` every
train.eval_interval steps and `finish` at the end; it never asks which kind it has.

    Text     a tokenized corpus (data/): next-token loss; evaluation = validation loss; finish = a sample
    Task     a synthetic task (data/tasks/): loss on scored positions; evaluation = accuracy by length (stop at
             train.stop_acc if set); finish = task_eval.json and accuracy_vs_length.png
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from duality import data as data_lib
from duality.common.errors import ConfigError, ShardError
from duality.common.io import write_atomic
from duality.data import tasks
from duality.kernels.varlen import slice_boundaries


class Objective:
    name: str
    tokenizer: data_lib.Tokenizer
    seq_len: int
    head: str = "lm"  # the model head the data needs (model.head=auto resolves to it)
    train_windows = None  # TokenWindows-like: len() and batch(ids)
    doc_boundaries: bool = False

    @property
    def vocab_size(self) -> int:
        return 64 * math.ceil(self.tokenizer.vocab_size / 64)  # padded: matmuls like multiples of 64

    def __init__(self, cfg, rt):
        self.t, self.rt = cfg.train, rt

    def setup(self, accum: int) -> None:
        """Batching over ranks, after the data exists: at least one global batch of windows."""
        t, rt, self.accum = self.t, self.rt, accum
        global_seqs = t.micro_batch * accum * rt.data_world
        if len(self.train_windows) < global_seqs:
            raise ShardError(
                f"data={self.name} has {len(self.train_windows):,} training windows of {self.seq_len} tokens, fewer "
                f"than one global batch of {global_seqs:,} sequences: lower train.global_batch_tokens (or batch_size)"
                " or add data")
        self.batches = data_lib.TrainBatches(self.train_windows, t.micro_batch, accum, rt.data_rank, rt.data_world)

    def micro_batches(self, step: int):
        """The accum micro-batches (x, y, {model kwargs: cu_seqlens, cp_group}) of this rank at `step`, on the
        device."""
        for micro in range(self.accum):
            batch = self.batches.get(step, micro)
            if self.doc_boundaries:  # boundaries found on the host: no sync
                batch = data_lib.pack_documents(*batch, self.tokenizer.eot_id)
            if self.rt.cp > 1:  # this rank's slice of every sequence (train.context_parallel)
                batch = context_slice(batch[:2], self.rt.cp_group, *batch[2:])
            if self.rt.cuda:  # from pinned memory the copy is asynchronous: the host runs ahead of the GPU
                batch = [b.pin_memory() for b in batch]
            x, y, *cu = (b.to(self.rt.device, non_blocking=True) for b in batch)
            yield x, y, {**({"cu_seqlens": cu[0]} if cu else {}),
                         **({"cp_group": self.rt.cp_group} if self.rt.cp > 1 else {})}

    def steps_for_epochs(self, epochs: float) -> int:
        per_step = self.t.micro_batch * self.accum * self.rt.data_world
        return max(1, math.ceil(epochs * len(self.train_windows) / per_step))

    def describe(self) -> str:
        raise NotImplementedError

    def evaluate(self, model) -> tuple[dict, dict, str]:
        """(metrics for the result, the row to log, the console line). Every rank calls it."""
        raise NotImplementedError

    def should_stop(self, metrics: dict) -> float | None:
        """The accuracy that ends training early (train.stop_acc), else None."""
        return None

    def finish(self, model, result: dict, cfg, out_dir: Path, run_cfg: dict) -> None:
        """After the last step (not after a pause)."""


class Text(Objective):
    def __init__(self, cfg, rt):
        super().__init__(cfg, rt)
        t = cfg.train
        self.name, self.seq_len, self.doc_boundaries = cfg.data.name, cfg.model.seq_len, bool(t.get("doc_boundaries"))
        # prepared by rank 0 (tokenizer + shards, cached) while the others wait and then read the cache
        if rt.master:
            self.info = data_lib.prepare(cfg.data, progress=t.progress)
        rt.barrier()
        if not rt.master:
            self.info = data_lib.prepare(cfg.data, progress=False)
        self.tokenizer = self.info.tokenizer
        self.train_windows = self.info.windows("train", self.seq_len, seed=cfg.seed)
        self.val_windows = self.info.windows("val", self.seq_len, shuffle=False)
        self.n_val = max(1, t.eval_tokens // self.seq_len)

    def describe(self):
        return (f"data: {self.name}: {self.info.n_train_tokens:,} train / {self.info.n_val_tokens:,} val tokens in "
                f"{self.info.dir}")

    def evaluate(self, model):
        rt = self.rt
        val = validation_loss(model, self.val_windows, self.n_val, self.t.micro_batch, rt.device, rt.autocast,
                              rt.data_rank, rt.data_world, self.tokenizer.eot_id if self.doc_boundaries else None,
                              rt.cp_group)
        ppl = math.exp(min(val, 50))
        return {"val_loss": val}, {"val_loss": val, "val_ppl": ppl}, f"val loss {val:.4f} | val ppl {ppl:.2f}"

    def finish(self, model, result, cfg, out_dir, run_cfg):
        t, rt = self.t, self.rt
        # FSDP: every rank runs the sampling forwards (each gathers parameters), the same tokens from the same seed
        if t.sample_tokens <= 0 or not (rt.master or rt.fsdp):
            return
        model.eval()
        tok = self.tokenizer
        prompt = torch.tensor([tok.encode(t.sample_prompt) or [tok.eot_id]], device=rt.device)
        try:
            with rt.autocast:
                out = model.generate(prompt, t.sample_tokens, temperature=0.8, top_k=50,
                                     generator=torch.Generator(rt.device).manual_seed(cfg.seed))
            result["sample"] = tok.decode(out[0].tolist())
        except RuntimeError as e:  # logits that overflow (a diverged model) make no distribution to sample
            if "probability tensor" not in str(e):
                raise
            print(f"sample: skipped, the model's next-token probabilities are not finite (loss "
                  f"{result.get('loss')})", file=sys.stderr)
        if rt.master and "sample" in result:
            print("sample:", repr(result["sample"]))


class Task(Objective):
    def __init__(self, cfg, rt):
        super().__init__(cfg, rt)
        self.task = tasks.build(cfg.data)  # generated from data.seed on every rank: deterministic, nothing on disk
        self.name, self.head, self.seq_len = self.task.name, self.task.head, self.task.seq_len
        if cfg.model.head not in ("auto", self.head):
            raise ConfigError(f"data={cfg.data.name} is scored with model.head={self.head}, this model has "
                              f"model.head={cfg.model.head}; use model.head=auto")
        self.tokenizer = data_lib.Tokenizer("symbols", json.dumps(self.task.symbols))
        self.train_windows = self.task.train
        self.stop_acc = cfg.train.get("stop_acc")

    def describe(self):
        task = self.task
        fresh = "fresh " if isinstance(task.train, tasks.Stream) else ""  # a Stream's len() is a nominal epoch
        return (f"data: task {task.name}: {len(task.train):,} {fresh}training examples of {self.seq_len} tokens an "
                f"epoch; evaluation: "
                f"{sum(len(e.inputs) for e in task.evals):,} examples, {task.unit}s up to "
                f"{max(e.length for e in task.evals)} (trained to {task.train_len})")

    def evaluate(self, model):
        rt = self.rt
        m = tasks.evaluate(model, self.task, self.t.micro_batch, rt.device, rt.autocast, rt.rank, rt.world)
        row = {**{k: v for k, v in m.items() if not k.startswith("curve")},
               **tasks.log_points(m["curve"], self.task.train_len)}
        return m, row, tasks.summary(m, self.task)

    def should_stop(self, metrics):
        acc = tasks.headline(metrics)  # every rank computed the same all-reduced number
        return acc if self.stop_acc is not None and acc >= self.stop_acc else None

    def finish(self, model, result, cfg, out_dir, run_cfg):
        if not self.rt.master or "curve" not in result:
            return
        task = self.task
        summary = {"task": task.name, "train_len": task.train_len, "unit": task.unit, "step": result["step"],
                   **{k: result[k] for k in (*tasks.SCORES, "curve", "curve_seq", "curve_char", "curve_family")
                      if k in result},
                   "tokens": result["tokens"], "config": run_cfg}
        write_atomic(out_dir / "task_eval.json", json.dumps(summary, indent=1))
        plot = out_dir / "accuracy_vs_length.png"
        tasks.plot_curves(tasks.labelled_curves(f"{cfg.backbone.name} + {cfg.pe.name}", result), plot, task.train_len,
                    task.unit, title=f"{task.name}: {cfg.run_name}")
        print(f"accuracy vs {task.unit}: {plot}")


def context_slice(tensors, group, cu_seqlens=None) -> list:
    """This rank's slice of each [B, T] tensor whose sequences are split over a context-parallel group: equal
    slices in rank order (GPT.forward places this rank's tokens at rank * T / N); with the document boundaries of a
    packed row, also the boundaries as the slice sees them (kernels/varlen.py: slice_boundaries)."""
    n = tensors[0].shape[1] // dist.get_world_size(group)
    r = dist.get_rank(group)
    sliced = [t[:, r * n:(r + 1) * n] for t in tensors]
    return sliced if cu_seqlens is None else [*sliced, slice_boundaries(cu_seqlens, r * n, n)]


def build(cfg, rt, accum: int) -> Objective:
    """The objective of cfg.data, its data ready and batched over ranks (`accum` micro-batches per step)."""
    objective = Task(cfg, rt) if tasks.is_task(cfg.data) else Text(cfg, rt)
    objective.setup(accum)
    return objective


@torch.no_grad()
def validation_loss(model, windows, n_windows: int, micro_batch: int, device, autocast, rank: int = 0,
                    world: int = 1, eot: int | None = None, cp_group=None) -> float:
    """Mean next-token loss over the first n_windows validation windows (fixed order), split across ranks (with
    eot: documents packed and kept apart, as train.doc_boundaries trains). rank and world count the groups that see
    different windows; with cp_group each window is split over the group's ranks as in training (a window too long
    for one GPU trains split, and is validated split too)."""
    model.eval()
    total, count = torch.zeros((), device=device), torch.zeros((), device=device)
    for ids in data_lib.rank_batches(min(n_windows, len(windows)), rank, world, micro_batch):
        x, y = windows.batch(ids or [0])  # none left on this rank: a forward with the others, not counted
        cu, split = [], {}
        if eot is not None:
            x, y, *cu = data_lib.pack_documents(x, y, eot)
        if cp_group is not None:  # this rank's slice of each window
            x, y, *cu = context_slice((x, y), cp_group, *cu)
            split = {"cp_group": cp_group}
        with autocast:
            _, loss = model(x.to(device), y.to(device), cu_seqlens=cu[0].to(device) if cu else None, **split)
        tokens = y.numel() if ids else 0  # by tokens: a packed batch is one row; the slices sum to the window
        total += loss.float() * tokens
        count += tokens
    if world > 1 or cp_group is not None:  # every rank holds a part: windows, or slices of them
        dist.all_reduce(total)
        dist.all_reduce(count)
    model.train()
    return (total / count.clamp(min=1)).item()
