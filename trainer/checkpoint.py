"""Checkpoints: what one holds, how it is written (atomically, `latest` naming the newest whole one), found (the
newest readable one of a run), checked against a run's config, and loaded back into a model; and the lock that keeps
two runs out of one out_dir.

A checkpoint holds: step, model (full state dict), optimizer (keyed by parameter name), scheduler, rng (per rank),
world_size, strategy, config (the run's resolved config, model.head as built), tokenizer, vocab_size, wandb_id,
stopped_at_acc, nonfinite_skipped (steps train.nonfinite=skip skipped). train.checkpoint_format says how it is
written: `full`, one torch.save file step_XXXXXXX.pt, the state gathered to rank 0; `sharded`, a folder step_XXXXXXX/
that torch.distributed.checkpoint writes from every rank at once (each its own FSDP shards, no gathering), the rest
in its meta.pt, read back on any world size and strategy (a resume: each rank what its own shards need).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from duality.common.errors import ConfigError, NonFinite, StorageError, describe_storage, storage_cause
from duality.common.io import atomic_open, pid_alive, write_atomic


@contextmanager
def one_process_quiet():
    """torch.distributed.checkpoint without a process group says, on every save and load, that it assumes one
    process: said once here (an asynchronous save's writer thread still says it; no block around the call reaches
    a thread)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is (disabled|unavailable)")
        yield


def rng_state():
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(s):
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if s["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


FORMATS = ("full", "sharded")


def save_checkpoint(ckpt_dir: Path, step: int, state: dict, keep: int) -> Path:
    """Write step_XXXXXXX.pt atomically, then repoint `latest` the same way: a crash at any moment leaves `latest`
    naming a complete checkpoint. Keeps the newest `keep` (0: all)."""
    path = Path(ckpt_dir) / f"step_{step:07d}.pt"
    with atomic_open(path, "wb") as f:
        torch.save(state, f)
    publish(path, keep)
    return path


class ShardedSave:
    """One sharded checkpoint: every rank writes its part of the model and optimizer state into step_XXXXXXX.tmp/
    with torch.distributed.checkpoint (a collective: each FSDP shard by its own rank, a replicated tensor once);
    then finish(): rank 0 adds meta.pt, renames the folder to step_XXXXXXX and repoints `latest`. A crash leaves a
    .tmp folder, never a partial checkpoint under a step's name. Asynchronous: the state is copied to CPU memory and
    written by a background thread over a gloo group of its own (the training's collectives go on beside it), and
    finish() waits for it."""

    def __init__(self, ckpt_dir: Path, step: int, tensors: dict, meta: dict, keep: int, rt,
                 asynchronous: bool = False, group=None):
        import torch.distributed.checkpoint as dcp
        self.step, self.meta, self.keep, self.rt = step, meta, keep, rt
        self.path = Path(ckpt_dir) / f"step_{step:07d}"
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        if rt.master:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp.mkdir(parents=True)
        rt.barrier()
        with one_process_quiet():
            if asynchronous:
                self.future = dcp.async_save(tensors, checkpoint_id=self.tmp, no_dist=not rt.distributed,
                                             process_group=group)
            else:
                self.future = None
                dcp.save(tensors, checkpoint_id=self.tmp, no_dist=not rt.distributed)

    def finish(self) -> Path:
        if self.future is not None:
            self.future.result()  # raises what the writer raised
        if self.rt.master:
            with atomic_open(self.tmp / "meta.pt", "wb") as f:
                torch.save(self.meta, f)
            if self.path.exists():  # the same step written again (a resumed run's last step): the new one wins
                shutil.rmtree(self.path)
            self.tmp.rename(self.path)
            publish(self.path, self.keep)
        self.rt.barrier()
        return self.path


def publish(path: Path, keep: int) -> None:
    """Point `latest` at a complete checkpoint, then keep the newest `keep` (0: all)."""
    write_atomic(path.parent / "latest", path.name)
    for old in step_checkpoints(path.parent)[:-keep] if keep > 0 else []:
        shutil.rmtree(old) if old.is_dir() else old.unlink()


def step_checkpoints(ckpt_dir: Path) -> list[Path]:
    """The complete checkpoints in a checkpoints/ folder, oldest first: step_*.pt files and step_* folders."""
    return sorted([*ckpt_dir.glob("step_*.pt"), *(d for d in ckpt_dir.glob("step_*") if is_sharded(d))],
                  key=lambda p: p.name.removesuffix(".pt"))


def is_sharded(path: Path) -> bool:
    """A sharded checkpoint's folder: what torch.distributed.checkpoint wrote (.metadata) and meta.pt."""
    return path.is_dir() and (path / ".metadata").is_file() and (path / "meta.pt").is_file()


def checkpoint_candidates(path: Path) -> list[Path]:
    """The checkpoints a run folder, a checkpoints/ folder or a `latest` file offers, newest first: the one
    `latest` names (if it can be read and exists), then every step_*.pt by step."""
    if path.name == "latest" and path.is_file():
        path = path.parent
    ckpt_dir = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    found = step_checkpoints(ckpt_dir)[::-1]
    named = None
    try:
        named = ckpt_dir / (ckpt_dir / "latest").read_text().strip()
    except FileNotFoundError:
        pass
    except (UnicodeDecodeError, OSError) as e:
        print(f"warning: {ckpt_dir / 'latest'} is unreadable ({type(e).__name__}): using the newest checkpoint",
              file=sys.stderr)
    if named is not None and named not in found:
        print(f"warning: {ckpt_dir / 'latest'} names {named.name}, which is missing: using the newest checkpoint",
              file=sys.stderr)
        named = None
    return ([named] if named else []) + [f for f in found if f != named]


EXPORT_MARKER = "duality_export.json"  # written by hf.py's export into every folder it writes


def export_folder(path: Path) -> Path | None:
    """The transformers export (hf.py's export) at `path` (its folder or its model.safetensors), else None."""
    folder = path.parent if path.name == "model.safetensors" else path
    if not (folder / "model.safetensors").is_file() or not (folder / "config.json").is_file():
        return None
    if (folder / EXPORT_MARKER).is_file():
        return folder
    try:  # exports written before the marker: a config.json of this model type
        return folder if json.loads((folder / "config.json").read_text()).get("model_type") == "duality" else None
    except (OSError, ValueError):
        return None


def read_export(folder: Path) -> dict:
    """An export as a checkpoint dict, so that eval.py reads it as it reads a run: the weights of model.safetensors
    (float32, as training keeps them), the model's config from config.json, and from the marker the tokenizer and
    the run's config (its data: perplexity's default); an export written before the marker held them gets its
    tokenizer from tokenizer.json (the same ids, hf.py) and no data config."""
    from safetensors.torch import load_file
    try:
        hf = json.loads((folder / "config.json").read_text())
        marker = json.loads((folder / EXPORT_MARKER).read_text()) if (folder / EXPORT_MARKER).is_file() else {}
        weights = {k.removeprefix("model."): v.float() for k, v in load_file(folder / "model.safetensors").items()}
        tokenizer = marker.get("tokenizer") or {"kind": "hf", "spec": (folder / "tokenizer.json").read_text()}
    except Exception as e:
        raise ConfigError(f"cannot read the export {folder}: {type(e).__name__}: {e}") from None
    if hf["model"].get("tie_embeddings") and "lm_head.weight" not in weights:  # saved once, under the embedding
        weights["lm_head.weight"] = weights["wte.weight"]
    run = marker.get("config") or {}
    config = {**run, "backbone": hf["backbone"], "pe": hf["pe"],
              "model": {**run.get("model", {}), **hf["model"]}}
    return {"step": marker.get("step", 0), "model": weights, "config": config, "tokenizer": tokenizer,
            "vocab_size": hf["vocab_size"], "export": str(folder)}


def resolve_checkpoint(path: Path, tensors: bool = True) -> tuple[Path | None, dict | None]:
    """The newest readable checkpoint of a run folder, checkpoints/ folder, `latest` file, checkpoint file or
    transformers export, and its contents (tensors=False: a sharded one's meta.pt only, its tensors left for
    Checkpointer.restore to read into the run's own layout). A newest checkpoint that cannot be read (a truncated
    copy, a full disk) is skipped with a warning that names it; an error only when none can be read."""
    if (folder := export_folder(path)) is not None:
        return folder / "model.safetensors", read_export(folder)
    if (path.is_file() and path.name != "latest") or is_sharded(path):
        return path, load_checkpoint(path, tensors)
    errors = []
    for cand in checkpoint_candidates(path):
        try:
            ckpt = load_checkpoint(cand, tensors)
        except ConfigError as e:
            errors.append(str(e))
            print(f"warning: skipping {cand}: {e}", file=sys.stderr)
            continue
        return cand, ckpt
    if errors:
        raise ConfigError(f"cannot read checkpoint: none of the {len(errors)} in {path} is readable ({errors[0]})")
    return None, None


def check_shards(path: Path) -> None:
    """A sharded checkpoint's files are all there and long enough for what its .metadata says they hold (a shard
    deleted or cut short by a copy or a full disk): a ConfigError naming the first that is not. Reads no tensor."""
    from torch.distributed.checkpoint import FileSystemReader
    try:
        storage = FileSystemReader(str(path)).read_metadata().storage_data
    except Exception as e:
        raise ConfigError(f"cannot read {path / '.metadata'}: {type(e).__name__}: {e}") from None
    need: dict[str, int] = {}
    for info in storage.values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(need.items()):
        shard = path / name
        if not shard.is_file():
            raise ConfigError(f"its shard {name} is missing")
        if shard.stat().st_size < size:
            raise ConfigError(f"its shard {name} is cut short ({shard.stat().st_size:,} of {size:,} bytes)")


def load_checkpoint(path: Path, tensors: bool = True) -> dict:
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception
    if path.is_dir() and is_sharded(path):
        try:
            check_shards(path)
        except ConfigError as e:
            raise ConfigError(f"cannot read checkpoint {path}: {e}") from None
    try:
        if path.is_dir() and not tensors:  # the run reads the shards itself, into its own layout
            ckpt = {**torch.load(path / "meta.pt", map_location="cpu", weights_only=False), "sharded": str(path)}
        else:
            ckpt = read_sharded(path) if path.is_dir() else torch.load(path, map_location="cpu", weights_only=False)
    except (Exception, CheckpointException) as e:
        first = (str(e).splitlines() or [""])[0][:300]
        raise ConfigError(f"cannot read checkpoint {path}: {type(e).__name__}: {first}") from None
    need = {"step", "config", "tokenizer"} | ({"model"} if "sharded" not in ckpt else set())
    missing = need - set(ckpt) if isinstance(ckpt, dict) else {"everything"}
    if missing:
        raise ConfigError(f"{path} is not a checkpoint of this repo (missing {sorted(missing)})")
    return ckpt


def read_sharded(path: Path) -> dict:
    """A sharded checkpoint read whole: meta.pt, and the model and optimizer state as full tensors (every shard
    read, whatever world size and strategy wrote them). Under torchrun a collective: every rank reads it, as every
    rank reads a full checkpoint."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys  # the one reader that
    # needs no template: the model is not built yet when a run resumes (it is loaded whole, before FSDP shards it)
    meta = torch.load(path / "meta.pt", map_location="cpu", weights_only=False)
    with one_process_quiet():
        state = _load_state_dict_from_keys({"model", "optimizer"}, checkpoint_id=str(path))
    return {**meta, **state}


class RunLock:
    """out_dir/run.lock: one run writes to an out_dir at a time. The file holds the owner's pid and host; a lock
    whose process is gone (same host) is stale, as after kill -9, and is taken over, so a killed run resumes."""

    def __init__(self, out_dir: Path):
        self.out_dir, self.path = out_dir, out_dir / "run.lock"
        self.held = False

    def acquire(self):
        self.out_dir.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    other = json.loads(self.path.read_text())
                except (OSError, ValueError):
                    other = {}  # being written right now: its owner is alive
                if other.get("host") == me["host"] and not _alive(other.get("pid")):
                    self._take_over(other)
                    continue
                raise ConfigError(
                    f"{self.out_dir} is in use by another run (pid {other.get('pid', '?')} on "
                    f"{other.get('host', '?')} since {other.get('since', '?')}); use another out_dir, or delete "
                    f"{self.path} if that run is gone") from None
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(me))
            self.held = True
            for tmp in (self.out_dir / "checkpoints").glob("*.tmp*"):  # a killed writer's leftovers: ours now
                shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
            return self
        raise ConfigError(f"{self.out_dir}: could not take {self.path}; delete it if no run uses this out_dir")

    def _take_over(self, stale: dict):
        """Remove a dead owner's lock. Two runs resuming at once must not both take it: one at a time (an O_EXCL
        side file), and only if the lock still holds what was read as stale (not a new owner's lock)."""
        side = self.path.with_name(self.path.name + ".takeover")
        try:
            fd = os.open(side, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            raise ConfigError(f"{self.out_dir}: another run is taking over the stale lock of process "
                              f"{stale.get('pid')}; delete {side} if no run is starting there") from None
        try:
            try:
                now = json.loads(self.path.read_text())
            except (OSError, ValueError):
                now = None
            if now == stale:
                print(f"{self.out_dir}: the lock of process {stale.get('pid')} (gone) is stale: taking it over",
                      file=sys.stderr)
                self.path.unlink(missing_ok=True)
        finally:
            os.close(fd)
            side.unlink(missing_ok=True)

    def release(self):
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False
            # a run that failed before writing anything leaves no folder (and one whose folder was removed, none)
            if self.out_dir.is_dir() and not any(self.out_dir.iterdir()):
                self.out_dir.rmdir()


def _alive(pid) -> bool:
    return not isinstance(pid, int) or pid_alive(pid)  # unknown: assume the owner lives


def load_weights(model, state: dict, path) -> None:
    """A checkpoint's weights into the model built from its config. Parameters whose names or shapes differ (a
    checkpoint written by another version of a mixer) are an error that lists them."""
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    reshaped = [f"{k} {tuple(state[k].shape)} -> {tuple(v.shape)}" for k, v in own.items()
                if k in state and state[k].shape != v.shape]
    if missing or unexpected or reshaped:
        show = lambda xs: f"{xs[:4]}{f' and {len(xs) - 4} more' if len(xs) > 4 else ''}"  # noqa: E731
        raise ConfigError(f"{path}: its weights do not fit this code's model (written by another version?): "
                          f"missing {show(missing)}, unexpected {show(unexpected)}, other shapes {show(reshaped)}")
    model.load_state_dict(state)


RESUME_CHANGES = ("seed", "train.steps")  # what resume_changes may name


_UNSET = object()


def check_resume_compatible(ckpt_cfg: dict, cfg) -> None:
    from omegaconf import OmegaConf

    from duality.model import with_defaults
    for group in ("backbone", "pe", "model", "optim", "data"):
        now = OmegaConf.to_container(cfg[group], resolve=True)
        then = dict(ckpt_cfg[group])
        if group in ("backbone", "pe", "model"):  # a run written when the yaml listed fewer options: their defaults
            now, then = with_defaults(group, now), with_defaults(group, then)
        if group == "data":  # where the cache lives does not change the data
            now.pop("cache_dir", None), then.pop("cache_dir", None)
        if group == "model" and now.get("head") == "auto":  # the checkpoint holds the head auto resolved to
            now.pop("head"), then.pop("head", None)
        if then != now:  # named key by key (both whole dicts were ~450 characters to read through)
            if then.get("name") != now.get("name") and group in ("backbone", "pe", "data"):
                diff, back = [f"{group} was {then.get('name')}, now {now.get('name')}"], f"{group}={then.get('name')}"
            else:
                keys = [k for k in sorted(set(then) | set(now), key=str) if then.get(k, _UNSET) != now.get(k, _UNSET)]
                show = lambda d, k: repr(d[k]) if k in d else "unset"  # noqa: E731
                diff = [f"{group}.{k} was {show(then, k)}, now {show(now, k)}" for k in keys]
                back = " ".join(f"{group}.{k}={then[k]}" if k in then else f"~{group}.{k}" for k in keys)
            raise ConfigError(f"cannot resume: {'; '.join(diff)}. Resume with the checkpoint's values ({back}), or "
                              "use another out_dir (or resume=never in an empty one)")
    allowed = list(cfg.get("resume_changes") or [])
    if unknown := sorted(set(allowed) - set(RESUME_CHANGES)):
        raise ConfigError(f"resume_changes={allowed}: {unknown} cannot be changed on resume; valid: "
                          f"{list(RESUME_CHANGES)} (every other key of the checkpoint's config must match)")
    then, now = ckpt_cfg.get("seed"), cfg.get("seed")
    if then is not None and then != now and "seed" not in allowed:  # it sets the data order: the run would change
        raise ConfigError(f"cannot resume: seed was {then}, now {now}; the seed sets the data order and the RNG "
                          f"streams, so the run would no longer be reproducible from its config. Resume with seed="
                          f"{then}, or allow the change: resume_changes=[seed]")
    for key in ("global_batch_tokens", "batch_size"):
        if ckpt_cfg["train"].get(key) != cfg.train.get(key):
            raise ConfigError(f"cannot resume: train.{key} was {ckpt_cfg['train'].get(key)}, now {cfg.train.get(key)} "
                              "(the data position is counted in global batches): resume with "
                              f"train.{key}={ckpt_cfg['train'].get(key)}")


def schedule_horizon(ckpt: dict | None, cfg, steps: int) -> int:
    """The steps the learning-rate schedule (warmup, decay, floor) is laid out over: this run's `steps`, or on resume
    the checkpoint's horizon. A resume with another train.steps keeps the checkpoint's horizon, so the lr never jumps
    (past it the lr stays at its floor), and says so; resume_changes=[train.steps] lays the schedule out over the new
    length instead, and says how the lr moves. (A finished 40-step run resumed to 400 steps restarted its schedule:
    the lr went from 3.0e-4 to 3.0e-3 at step 42, without a word.)"""
    if ckpt is None:
        return steps
    then = ckpt.get("schedule_steps") or ckpt["config"]["train"].get("steps")
    if then is None or then == steps:
        return steps
    from .optim import lr_lambda
    o, step = cfg.optim, ckpt["step"]
    lr_then, lr_now = (o.lr * lr_lambda(o, n)(step) for n in (then, steps))
    say = os.environ.get("RANK", "0") == "0"
    if "train.steps" in list(cfg.get("resume_changes") or []):
        if say:
            print(f"resume: the {o.schedule} schedule is laid out over {steps} steps instead of {then} "
                  f"(resume_changes=[train.steps]): at step {step} the lr goes from {lr_then:.3g} to {lr_now:.3g}",
                  file=sys.stderr)
        return steps
    if say:
        print(f"resume: train.steps is {steps}, the checkpoint's schedule was laid out over {then}: it keeps that "
              f"horizon (the lr stays at {o.lr * lr_lambda(o, then)(then):.3g} past step {then}); "
              f"resume_changes=[train.steps] lays it out over {steps} steps instead", file=sys.stderr)
    return then


def newest_checkpoint(path) -> Path:
    """A checkpoint file, a `latest` pointer, a checkpoints/ folder, a run's out_dir or an export (its
    model.safetensors): the newest checkpoint there,
    found as resume=auto finds it; an error naming the valid forms when there is none."""
    p = Path(path)
    if (folder := export_folder(p)) is not None:
        return folder / "model.safetensors"
    if (p.is_file() and p.name != "latest") or is_sharded(p):
        return p
    found = checkpoint_candidates(p) if p.exists() else []
    if not found:
        raise ConfigError(f"ckpt={str(path)!r}: no checkpoint there (give a step_*.pt file, a checkpoints/ folder, "
                          "a run's out_dir or an export's folder)")
    return found[0]


def read_checkpoint(path) -> tuple[Path, dict]:
    """The newest readable checkpoint at `path` (a file, a `latest` pointer, a checkpoints/ folder or a run's
    out_dir): its file and its dict."""
    ckpt_path, ckpt = resolve_checkpoint(Path(path))
    if ckpt is None:
        newest_checkpoint(path)  # raises: there is none at all
    return ckpt_path, ckpt


def load_model(path, device="cpu"):
    """The model (in eval mode), tokenizer and checkpoint dict of the newest readable checkpoint at `path`."""
    from duality.data import Tokenizer
    from duality.model import build_model
    ckpt_path, ckpt = read_checkpoint(path)
    cfg = ckpt["config"]
    model = build_model(cfg["backbone"], cfg["pe"], cfg["model"], ckpt["vocab_size"])
    load_weights(model, ckpt["model"], ckpt_path)
    return model.to(device).eval(), Tokenizer.from_dict(ckpt["tokenizer"]), ckpt


def find_resume(cfg, out_dir: Path) -> tuple[Path | None, dict | None]:
    """resume=auto: the newest readable checkpoint of out_dir (or none); never: none, and out_dir must hold none;
    a path: that checkpoint. Checked against this run's config, before any data is prepared."""
    path, ckpt = None, None
    if str(cfg.resume) == "auto":
        path, ckpt = resolve_checkpoint(out_dir, tensors=False)
    elif str(cfg.resume) == "never":
        if checkpoint_candidates(out_dir):
            raise ConfigError(f"{out_dir} already holds checkpoints and resume=never; use resume=auto or another "
                              "out_dir")
    else:
        path = Path(str(cfg.resume))
        ckpt = load_checkpoint(path, tensors=False)
    if ckpt is not None:
        check_resume_compatible(ckpt["config"], cfg)
    return path, ckpt


class Checkpointer:
    """Writes the training state every train.ckpt_interval steps (full: rank 0 writes, under FSDP every rank joins
    the gathering; sharded: every rank writes its part), only ever a finite one: retention then never deletes the
    last good checkpoint for a bad one. Asynchronous (train.async_checkpoint): a save is published when the next
    save, or the run's end (Runtime.close), finds it written."""

    def __init__(self, out_dir: Path, rt, model, optimizer, scheduler, meta: dict, keep: int, last: Path | None,
                 format: str = "full", asynchronous: bool = False):
        self.dir, self.rt, self.model = out_dir / "checkpoints", rt, model
        self.optimizer, self.scheduler = optimizer, scheduler
        self.meta, self.keep, self.last_good, self.format = meta, keep, last, format
        self.asynchronous, self.group, self.pending = asynchronous, None, None
        if asynchronous:
            if rt.distributed:  # a gloo group of its own: the writer thread's collectives never meet training's
                import torch.distributed as dist
                self.group = dist.new_group(backend="gloo")
            rt.on_close.append(self.wait)
        self.nonfinite_skipped = 0  # steps train.nonfinite=skip skipped since the run began (trainer/guard.py)

    def diverged(self, step: int, what: str) -> NonFinite:
        good = self.last_good
        return NonFinite(f"step {step}: {what}; stopped without checkpointing it. The last good checkpoint is "
                         f"{good or 'none'}" + (" (resume=auto continues from it)" if good else "")
                         + "; a lower optim.lr, longer optim.warmup or optim.grad_clip may help")

    def save(self, step: int, stopped_at_acc: float | None = None, wandb_id: str | None = None) -> None:
        rt, opt = self.rt, self.optimizer
        if not rt.all_finite([*self.model.parameters(), *(v for st in opt.state.values() for v in st.values())]):
            raise self.diverged(step, "the weights or optimizer state are not finite")
        self.wait()
        rngs = rt.gather_objects(rng_state())
        meta = {"step": step, "strategy": "fsdp" if rt.fsdp else "ddp", "scheduler": self.scheduler.state_dict(),
                "rng": rngs, "world_size": rt.world, "wandb_id": wandb_id, "stopped_at_acc": stopped_at_acc,
                "nonfinite_skipped": self.nonfinite_skipped, "schedule_steps": getattr(self.scheduler, "horizon", None),
                **self.meta}
        with self.storage_errors(step):
            if self.format == "sharded":
                save = ShardedSave(self.dir, step, rt.sharded_state(self.model, opt), meta, self.keep, rt,
                                   self.asynchronous, self.group)
                if self.asynchronous:
                    self.pending = save
                    return
                self.last_good = save.finish()
                return
            model_sd, optim_sd = rt.model_state(self.model), rt.optimizer_state(self.model, opt)
            if rt.master:
                save_checkpoint(self.dir, step, {**meta, "model": model_sd, "optimizer": optim_sd}, self.keep)
        self.last_good = self.dir / f"step_{step:07d}.pt"

    def wait(self) -> None:
        """Publish the asynchronous save in flight, once written (a no-op when none is)."""
        if self.pending is not None:
            save, self.pending = self.pending, None
            with self.storage_errors(save.step):
                self.last_good = save.finish()

    def load_sharded(self, folder: Path) -> None:
        """A sharded checkpoint's model and optimizer state straight into this run's layout: every rank reads what
        its own tensors need (its FSDP shards, or the whole tensors under DDP), whatever world size and strategy
        wrote it; nothing is assembled whole in one place."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)  # the templates: this run's own layout
        state = {"model": model_sd, "optimizer": optim_sd}
        try:
            with one_process_quiet():
                dcp.load(state, checkpoint_id=folder, no_dist=not self.rt.distributed)
        except (Exception, CheckpointException) as e:  # a parameter the checkpoint lacks (another version of a
            # mixer), or a shard damaged after the run chose it
            raise ConfigError(f"{folder}: its state does not fit this code's model and optimizer (written by another "
                              f"version?): {type(e).__name__}: {str(e).splitlines()[0][:300]}") from None
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])

    @contextmanager
    def storage_errors(self, step: int):
        """A full disk or a place that cannot be written: one StorageError naming the last good checkpoint."""
        try:
            yield
        except (OSError, RuntimeError) as e:
            if (cause := storage_cause(e)) is None:
                raise
            good = self.last_good
            raise StorageError(f"step {step}: checkpoint not written: {describe_storage(cause)}. The last good "
                               f"checkpoint is {good or 'none'}" + (" (resume=auto continues from it)" if good
                                                                    else "")) from e

    def restore(self, ckpt: dict, seed: int) -> int:
        """Optimizer, schedule and RNG streams of `ckpt` (None: fresh streams from seed); returns the start step."""
        rt = self.rt
        if ckpt is not None:
            self.nonfinite_skipped = ckpt.get("nonfinite_skipped", 0)
            if "sharded" in ckpt:
                self.load_sharded(Path(ckpt["sharded"]))
            else:
                rt.load_optimizer_state(self.model, self.optimizer, ckpt["optimizer"])
            self.scheduler.load_state_dict(ckpt["scheduler"])
            # the next step's lr from this run's schedule (its optimizer state kept the checkpoint's, and a resume
            # may lay the schedule out anew: schedule_horizon); the same value when it is unchanged
            sch = self.scheduler
            for group, lam, base in zip(self.optimizer.param_groups, sch.lr_lambdas, sch.base_lrs):
                group["lr"] = base * lam(sch.last_epoch)
            sch._last_lr = [g["lr"] for g in self.optimizer.param_groups]  # what get_last_lr() reads
            if ckpt["world_size"] == rt.world:
                set_rng_state(ckpt["rng"][rt.rank])
                return ckpt["step"]
            if rt.master:
                print(f"resuming a {ckpt['world_size']}-process run on {rt.world}: same global batches (the data "
                      "order is world-size independent); per-rank RNG streams are reseeded", file=sys.stderr)
        random.seed(seed + rt.rank)
        np.random.seed(seed + rt.rank)
        torch.manual_seed(seed + rt.rank)
        return 0 if ckpt is None else ckpt["step"]
