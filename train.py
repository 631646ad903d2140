"""Train a GPT whose token mixer and positional scheme come from the config.

    python train.py                                          # transformer + RoPE, tiny, embedded corpus
    python train.py backbone=linear_attn pe=nope train.steps=50
    python train.py -m pe=nope,rope,alibi optim.lr=1e-3,2e-3  # Hydra multirun sweep
    torchrun --nproc_per_node=8 train.py model=124m data=text data.files='corpus/*.txt'

The loop knows nothing about the model it trains: model/ builds it from the backbone, pe and model groups.
Everything a run makes goes to out_dir: checkpoints/ (atomic, `latest` points at the newest), metrics.jsonl
(every logged number), and wandb/ (offline unless you are logged in).
"""

from __future__ import annotations

import json
import math
import os
import random
import socket
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from data import write_atomic
from data.tasks import is_task
from kernels.attention import training_backends
from model import ConfigError, build_model, check_model_config

# Dense bf16 peak FLOP/s per device, for MFU. Matched by substring of torch.cuda.get_device_name().
PEAK_FLOPS = {
    "H200": 989e12, "H100": 989e12, "H800": 989e12, "GH200": 989e12, "B200": 2250e12, "B100": 1750e12,
    "A100": 312e12, "A800": 312e12, "L40S": 362e12, "L40": 181e12, "A6000": 155e12, "A40": 150e12,
    "L4": 121e12, "A10G": 70e12, "A10": 125e12, "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12,
}
SCHEDULES = ("cosine", "wsd", "linear", "constant")
STRATEGIES = ("ddp", "fsdp")
LOGGER_MODES = ("auto", "online", "offline", "disabled")


# ----------------------------------------------------------------------------------------------- config checks
def check_config(cfg, world: int = 1) -> dict:
    """Everything that can be checked before any work; returns derived numbers (steps, grad_accum)."""
    t, o = cfg.train, cfg.optim
    for key, value, low in (("model.n_layer", cfg.model.n_layer, 1), ("model.seq_len", cfg.model.seq_len, 1),
                            ("train.micro_batch", t.micro_batch, 1), ("train.log_interval", t.log_interval, 1),
                            ("train.eval_interval", t.eval_interval, 1), ("train.ckpt_interval", t.ckpt_interval, 1),
                            ("train.keep_checkpoints", t.keep_checkpoints, 0), ("train.eval_tokens", t.eval_tokens, 1),
                            ("train.sample_tokens", t.sample_tokens, 0),
                            *((f"train.{k}", t[k], 1) for k in ("steps", "batch_size", "global_batch_tokens")
                              if t.get(k) is not None)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ConfigError(f"{key}={value!r}: an integer >= {low}" + (" (or null)" if key == "train.steps" else ""))
    for key, value in (("optim.lr", o.lr), *((f"train.{k}", t[k]) for k in ("tokens", "epochs") if t.get(k) is not None)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{key}={value!r}: a number >= 0")
    for key, hi, what in (("time_limit", math.inf, "seconds > 0"), ("stop_acc", 1, "an accuracy in (0, 1]")):
        v = t.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= hi):
            raise ConfigError(f"train.{key}={v!r}: {what}, or null")
    if o.lr == 0:
        print("warning: optim.lr=0: the weights will not change", file=sys.stderr)
    check_model_config(dict(cfg.backbone), dict(cfg.pe), dict(cfg.model))
    seq = cfg.model.seq_len
    if t.get("batch_size"):  # in sequences (synthetic tasks); global_batch_tokens is then derived
        per_micro = t.micro_batch * world
        if t.batch_size % per_micro:
            raise ConfigError(f"train.batch_size={t.batch_size} is not a multiple of micro_batch x world_size = "
                              f"{t.micro_batch} x {world}; e.g. batch_size={max(1, round(t.batch_size / per_micro)) * per_micro}")
        accum, batch_tokens = t.batch_size // per_micro, t.batch_size * seq
    else:
        per_micro = t.micro_batch * seq * world
        if t.global_batch_tokens % per_micro:
            raise ConfigError(
                f"train.global_batch_tokens={t.global_batch_tokens} is not a multiple of micro_batch x seq_len x "
                f"world_size = {t.micro_batch} x {seq} x {world} = {per_micro}; e.g. global_batch_tokens="
                f"{max(1, round(t.global_batch_tokens / per_micro)) * per_micro}")
        accum, batch_tokens = t.global_batch_tokens // per_micro, t.global_batch_tokens
    if t.get("epochs") and t.steps is None and not is_task(cfg.data):
        raise ConfigError("train.epochs counts passes over a synthetic task's examples; for text use train.tokens "
                          "or train.steps")
    steps = t.steps if t.steps is not None else (None if t.get("epochs") else int(t.tokens // batch_tokens))
    if steps is not None and steps < 1:
        raise ConfigError(f"the budget gives {steps} steps: raise train.tokens or set train.steps")
    if is_task(cfg.data) and cfg.data.get("seq_len", 0) > seq:
        raise ConfigError(f"data={cfg.data.name} trains on sequences of {cfg.data.seq_len} tokens but model.seq_len="
                          f"{seq}; set model.seq_len={cfg.data.seq_len} (the task configs in conf/task/ do)")
    if o.schedule not in SCHEDULES:
        raise ConfigError(f"optim.schedule={o.schedule!r}; valid choices: {list(SCHEDULES)}")
    if cfg.logger.mode not in LOGGER_MODES:
        raise ConfigError(f"logger.mode={cfg.logger.mode!r}; valid choices: {list(LOGGER_MODES)}")
    if t.dtype not in ("auto", "bf16", "fp32"):
        raise ConfigError(f"train.dtype={t.dtype!r}; valid choices: ['auto', 'bf16', 'fp32']")
    if not isinstance(t.get("profile_steps", 0), int) or t.get("profile_steps", 0) < 0:
        raise ConfigError(f"train.profile_steps={t.profile_steps!r}: the number of steps to profile, an integer >= 0")
    if t.get("strategy", "ddp") not in STRATEGIES:
        raise ConfigError(f"train.strategy={t.strategy!r}; valid choices: {list(STRATEGIES)}")
    if t.get("doc_boundaries") and is_task(cfg.data):
        raise ConfigError(f"train.doc_boundaries packs text documents; data={cfg.data.name} is a synthetic task whose "
                          "examples are already separate sequences: leave it false")
    if t.device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"train.device={t.device!r}; valid choices: ['auto', 'cpu', 'cuda']")
    if t.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device=cuda but no CUDA device is visible; use train.device=auto or cpu")
    if str(cfg.resume) not in ("auto", "never") and not Path(str(cfg.resume)).is_file():
        raise ConfigError(f"resume={cfg.resume!r}: not a checkpoint file; valid: auto, never, or a path to a .pt file")
    return {"steps": steps, "grad_accum": accum, "batch_tokens": batch_tokens}


# ------------------------------------------------------------------------------------------------ optimisation
def lr_lambda(o, total: int):
    """The multiplier of optim.lr at each step: linear warmup, then cosine / WSD / constant."""
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
            return 1.0 if step < start else 1.0 - (1 - lo) * (step - start) / max(1, total - start)
        return 1.0
    return f


def make_optimizer(model, o, fused: bool):
    """Decay matrices (and embeddings); never norms, biases or other vectors."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": o.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps, fused=fused)


def train_step(train_model, micro_batches, accum: int, optimizer, scheduler, autocast, grad_clip: float,
               skip_sync=None):
    """One optimizer step over `accum` micro-batches (an iterable of device tensors x, y): gradients accumulate
    (under `skip_sync()` the gradient reduction across ranks waits for the last one), are clipped, and the optimizer
    and schedule advance. Returns the mean loss and the gradient norm as device tensors: nothing here waits for the
    GPU."""
    loss_sum = 0.0
    for micro, (x, y, *cu) in enumerate(micro_batches):  # (x, y) or (x, y, cu_seqlens)
        sync = skip_sync() if skip_sync is not None and micro < accum - 1 else nullcontext()
        with sync, autocast, training_backends():
            _, loss = train_model(x, y, cu_seqlens=cu[0]) if cu else train_model(x, y)
        (loss / accum).backward()
        loss_sum = loss_sum + loss.detach() / accum
    # grad_clip null: the norm is still computed (for the log and the non-finite check), nothing is clipped
    grad_norm = torch.nn.utils.clip_grad_norm_(train_model.parameters(), math.inf if grad_clip is None else grad_clip)
    if hasattr(grad_norm, "full_tensor"):  # FSDP: a replicated DTensor
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm


class Profiler:
    """train.profile_steps=N: a torch.profiler trace of N steps after 3 warm-up steps (compilation, autotuning),
    written to out_dir/profile/ (open trace.json in https://ui.perfetto.dev) with a table of the costliest ops."""

    def __init__(self, n: int, out_dir: Path, master: bool, device):
        from torch.profiler import ProfilerActivity, profile, schedule
        self.dir, self.master, self.n = out_dir / "profile", master, n
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.prof = profile(activities=acts, schedule=schedule(wait=0, warmup=3, active=n, repeat=1),
                            on_trace_ready=self._write)
        self.prof.start()
        self.running = True

    def step(self, i: int):
        """Called before step i of this process (the profiler counts the steps that ended)."""
        if i > 0 and self.running:
            self.prof.step()
            if i >= 3 + self.n:
                self.close()

    def close(self):
        if self.running:
            self.prof.stop()
            self.running = False

    def _write(self, prof):
        if not self.master:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.dir / "trace.json"))
        sort = "cuda_time_total" if any(e.device_type.name == "CUDA" for e in prof.events()) else "cpu_time_total"
        (self.dir / "ops.txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=40))
        print(f"profile of {self.n} steps: {self.dir}/trace.json, {self.dir}/ops.txt", file=sys.stderr)


# ------------------------------------------------------------------------------------------------ distribution
def shard_model(model, device):
    """train.strategy=fsdp: FSDP2 shards each block, then the rest (embeddings, head), over all ranks; parameters
    become DTensors and are gathered one block at a time in forward and backward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


@contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _full_state_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def model_state(model, fsdp: bool) -> dict:
    """The whole model's state dict, whatever the strategy (FSDP: gathered to rank 0; a collective)."""
    if not fsdp:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    return get_model_state_dict(model, options=_full_state_options())


def optimizer_state(model, optimizer, fsdp: bool) -> dict:
    """Optimizer state keyed by parameter name (FSDP's full form), so a checkpoint loads under any strategy and
    world size. FSDP: gathered to rank 0 (a collective)."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
        return get_optimizer_state_dict(model, optimizer, options=_full_state_options())
    sd = optimizer.state_dict()  # keyed by position over the param groups
    names = {id(p): n for n, p in model.named_parameters()}
    key = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    return {"state": {key[i]: v for i, v in sd["state"].items()},
            "param_groups": [{**g, "params": [key[i] for i in g["params"]]} for g in sd["param_groups"]]}


def load_optimizer_state(model, optimizer, sd: dict, fsdp: bool) -> None:
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
        set_optimizer_state_dict(model, optimizer, sd, options=StateDictOptions(full_state_dict=True))
        return
    groups = sd["param_groups"]
    if groups and groups[0]["params"] and isinstance(groups[0]["params"][0], str):  # by name -> by position
        pos = {n: i for i, n in enumerate(n for g in groups for n in g["params"])}
        sd = {"state": {pos[n]: v for n, v in sd["state"].items()},
              "param_groups": [{**g, "params": [pos[n] for n in g["params"]]} for g in groups]}
    optimizer.load_state_dict(sd)


# ------------------------------------------------------------------------------------------------- checkpoints
def _rng_state():
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _set_rng_state(s):
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if s["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def save_checkpoint(ckpt_dir: Path, step: int, state: dict, keep: int) -> Path:
    """Write step_XXXXXXX.pt through a temporary file (named after this process: two writers never share one) and
    rename, then repoint `latest` the same way: a crash at any moment leaves `latest` naming a complete checkpoint."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = ckpt_dir / f"step_{step:07d}.pt"
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    write_atomic(ckpt_dir / "latest", path.name)
    for old in sorted(ckpt_dir.glob("step_*.pt"))[:-keep] if keep > 0 else []:
        old.unlink()
    return path


def checkpoint_candidates(path: Path) -> list[Path]:
    """The checkpoints a run folder, a checkpoints/ folder or a `latest` file offers, newest first: the one
    `latest` names (if it can be read and exists), then every step_*.pt by step."""
    if path.name == "latest" and path.is_file():
        path = path.parent
    ckpt_dir = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    found = sorted(ckpt_dir.glob("step_*.pt"), reverse=True)
    named = None
    try:
        named = ckpt_dir / (ckpt_dir / "latest").read_text().strip()
    except FileNotFoundError:
        pass
    except (UnicodeDecodeError, OSError) as e:
        print(f"warning: {ckpt_dir / 'latest'} is unreadable ({type(e).__name__}): using the newest step_*.pt",
              file=sys.stderr)
    if named is not None and named not in found:
        print(f"warning: {ckpt_dir / 'latest'} names {named.name}, which is missing: using the newest step_*.pt",
              file=sys.stderr)
        named = None
    return ([named] if named else []) + [f for f in found if f != named]


def resolve_checkpoint(path: Path) -> tuple[Path | None, dict | None]:
    """The newest readable checkpoint of a run folder, checkpoints/ folder, `latest` file or checkpoint file, and its
    contents. A newest checkpoint that cannot be read (a truncated copy, a full disk) is skipped with a warning that
    names it; an error only when none can be read."""
    if path.is_file() and path.name != "latest":
        return path, load_checkpoint(path)
    errors = []
    for cand in checkpoint_candidates(path):
        try:
            ckpt = load_checkpoint(cand)
        except ConfigError as e:
            errors.append(str(e))
            print(f"warning: skipping {cand}: {e}", file=sys.stderr)
            continue
        return cand, ckpt
    if errors:
        raise ConfigError(f"cannot read checkpoint: none of the {len(errors)} in {path} is readable ({errors[0]})")
    return None, None


def load_checkpoint(path: Path) -> dict:
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise ConfigError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from None
    missing = {"step", "model", "config", "tokenizer"} - set(ckpt) if isinstance(ckpt, dict) else {"everything"}
    if missing:
        raise ConfigError(f"{path} is not a checkpoint of this repo (missing {sorted(missing)})")
    return ckpt


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
                tmp.unlink(missing_ok=True)
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
            if not any(self.out_dir.iterdir()):  # a run that failed before writing anything leaves no folder
                self.out_dir.rmdir()


def _alive(pid) -> bool:
    if not isinstance(pid, int):
        return True  # unknown: assume the owner lives
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def all_finite(tensors, distributed: bool = False) -> bool:
    """Whether every tensor (the local shards under FSDP) is finite on every rank: one reduction, one sync."""
    local = [x.to_local() if hasattr(x, "to_local") else x for x in tensors]  # FSDP: DTensor shards
    flags = [torch.isfinite(x).all() for x in local if torch.is_tensor(x) and x.is_floating_point()]
    ok = torch.stack(flags).all().float() if flags else torch.ones(())
    if distributed:
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())


class NonFinite(RuntimeError):
    """The loss or the weights stopped being finite: the run stops without checkpointing that state."""


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


def _sweep():
    """Hydra's config of this job when it is one job of a multirun sweep, else None."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
    except ImportError:
        return None
    return HydraConfig.get() if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN else None


def default_out_dir(cfg) -> Path:
    """outputs/<run_name>, or in a Hydra multirun the job's own sweep folder (so sweep jobs never share one)."""
    sweep = _sweep()
    return Path(sweep.runtime.output_dir) if sweep else Path("outputs") / cfg.run_name


def check_resume_compatible(ckpt_cfg: dict, cfg) -> None:
    from omegaconf import OmegaConf
    for group in ("backbone", "pe", "model", "optim", "data"):
        now = OmegaConf.to_container(cfg[group], resolve=True)
        then = dict(ckpt_cfg[group])
        if group == "data":  # where the cache lives does not change the data
            now.pop("cache_dir", None), then.pop("cache_dir", None)
        if group == "model" and now.get("head") == "auto":  # the checkpoint holds the head auto resolved to
            now.pop("head"), then.pop("head", None)
        if then != now:
            raise ConfigError(f"cannot resume from {group} config {then}: this run's is {now}; use another out_dir "
                              "(or resume=never in an empty one)")
    for key in ("global_batch_tokens", "batch_size"):
        if ckpt_cfg["train"].get(key) != cfg.train.get(key):
            raise ConfigError(f"cannot resume: train.{key} was {ckpt_cfg['train'].get(key)}, now {cfg.train.get(key)} "
                              "(the data position is counted in global batches)")


# ------------------------------------------------------------------------------------------------------ logging
class Logger:
    """metrics.jsonl always; wandb when enabled (offline without credentials); console through tqdm."""

    def __init__(self, cfg, out_dir: Path, enabled: bool, run_id: str | None, start_step: int = 0):
        self.enabled, self.wandb, self.wandb_from = enabled, None, 0
        if enabled:
            self._truncate(out_dir / "metrics.jsonl", start_step)
        self.file = open(out_dir / "metrics.jsonl", "a") if enabled else None
        if not enabled or cfg.logger.mode == "disabled":
            return
        import wandb
        mode = cfg.logger.mode
        if mode == "auto":
            mode = "online" if (os.environ.get("WANDB_API_KEY") or _wandb_logged_in()) else "offline"
        from omegaconf import OmegaConf
        sweep = _sweep()  # a sweep's jobs share a wandb group named after its folder, unless logger.group says
        group = cfg.logger.group or (Path(sweep.sweep.dir).name if sweep else None)
        self.wandb = wandb.init(project=cfg.logger.project, entity=cfg.logger.entity, group=group,
                                tags=list(cfg.logger.tags), name=cfg.run_name, dir=str(out_dir), mode=mode,
                                id=run_id, resume="allow", config=OmegaConf.to_container(cfg, resolve=True))
        # a resumed wandb run refuses steps below its last one (the crashed attempt logged them): do not send them
        self.wandb_from = self.wandb.step if run_id else 0

    @staticmethod
    def _truncate(path: Path, step: int):
        """Drop the rows after `step` (what a killed run logged past its last checkpoint), atomically: the resumed
        run logs those steps again, and the file keeps one row per step and kind."""
        if not path.exists():
            return
        lines = path.read_text().splitlines()
        def row(ln):
            try:
                return json.loads(ln)
            except ValueError:
                return None  # a line cut short by the kill
        keep = [ln for ln in lines if (r := row(ln)) is not None and r.get("step", 0) <= step]
        if len(keep) != len(lines):
            write_atomic(path, "".join(ln + "\n" for ln in keep))

    @property
    def run_id(self):
        return self.wandb.id if self.wandb is not None else None

    def log(self, row: dict):
        if not self.enabled:
            return
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.wandb is not None and row["step"] >= self.wandb_from:
            self.wandb.log({k: v for k, v in row.items() if k != "step" and v is not None}, step=row["step"])

    def close(self):
        if self.file:
            self.file.close()
        if self.wandb is not None:
            self.wandb.finish()


def _wandb_logged_in() -> bool:
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.exists() and "api.wandb.ai" in netrc.read_text()


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


# ------------------------------------------------------------------------------------------------------- eval
@torch.no_grad()
def evaluate(model, windows, n_windows: int, micro_batch: int, device, autocast, rank: int, world: int,
             eot: int | None = None) -> float:
    """Mean next-token loss over the first n_windows validation windows (fixed order), split across ranks (with
    eot: documents packed and kept apart, as train.doc_boundaries trains)."""
    from data import pack_documents
    model.eval()
    ids = list(range(min(n_windows, len(windows))))[rank::world]
    total, count = torch.zeros((), device=device), torch.zeros((), device=device)
    for i in range(0, len(ids), micro_batch):
        x, y = windows.batch(ids[i:i + micro_batch])
        cu = None
        if eot is not None:
            x, y, cu = pack_documents(x, y, eot)
            cu = cu.to(device)
        with autocast:
            _, loss = model(x.to(device), y.to(device), cu_seqlens=cu)
        total += loss.float() * y.numel()  # by tokens: a packed batch is one row
        count += y.numel()
    if world > 1:
        dist.all_reduce(total)
        dist.all_reduce(count)
    model.train()
    return (total / count.clamp(min=1)).item()


# -------------------------------------------------------------------------------------------------------- main
def run(cfg) -> dict:
    """Train as the config says; returns the final metrics. Raises ConfigError / ShardError on bad input and
    NonFinite when training diverges. The out_dir's lock is released however it ends."""
    held = []
    try:
        return _run(cfg, held)
    finally:
        for lock in held:
            lock.release()


def _run(cfg, held: list) -> dict:
    from omegaconf import OmegaConf

    import data as data_lib
    from data import tasks

    distributed = "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    rank, world, local_rank = 0, 1, 0
    if distributed:
        rank, world, local_rank = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    derived = check_config(cfg, world)
    fsdp = distributed and cfg.train.get("strategy", "ddp") == "fsdp"
    steps, accum, batch_tokens = derived["steps"], derived["grad_accum"], derived["batch_tokens"]
    t = cfg.train
    use_cuda = t.device == "cuda" or (t.device == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if distributed:
        if use_cuda:
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    master = rank == 0
    out_dir = Path(cfg.out_dir) if cfg.out_dir else default_out_dir(cfg)

    if master:  # one run per out_dir, before anything is read or written there
        held.append(RunLock(out_dir).acquire())

    # resume decision first: a bad checkpoint must fail before data preparation
    ckpt = ckpt_path = None
    if str(cfg.resume) == "auto":
        ckpt_path, ckpt = resolve_checkpoint(out_dir)
    elif str(cfg.resume) == "never":
        if checkpoint_candidates(out_dir):
            raise ConfigError(f"{out_dir} already holds checkpoints and resume=never; use resume=auto or another out_dir")
    else:
        ckpt_path = Path(str(cfg.resume))
        ckpt = load_checkpoint(ckpt_path)
    if ckpt is not None:
        check_resume_compatible(ckpt["config"], cfg)

    # data: a synthetic task is generated from data.seed on every rank (deterministic, nothing on disk); text is
    # prepared by rank 0 (tokenizer + shards, cached) while the others wait and then read the cache
    task = None
    if is_task(cfg.data):
        task = tasks.build(cfg.data)
        if cfg.model.head == "auto":  # resolved here, so the checkpoint's config names the head it was built with
            cfg.model.head = task.head
        if task.head != cfg.model.head:
            raise ConfigError(f"data={cfg.data.name} is scored with model.head={task.head}, this model has "
                              f"model.head={cfg.model.head}; use model.head=auto")
        tok = data_lib.Tokenizer("symbols", json.dumps(task.symbols))
        train_windows, seq = task.train, task.seq_len
        batch_tokens = t.micro_batch * accum * world * seq
        if steps is None:  # train.epochs
            steps = max(1, math.ceil(t.epochs * len(task.train) / (t.micro_batch * accum * world)))
    else:
        if master:
            info = data_lib.prepare(cfg.data, progress=t.progress)
        if distributed:
            dist.barrier()
        if not master:
            info = data_lib.prepare(cfg.data, progress=False)
        tok, seq = info.tokenizer, cfg.model.seq_len
        train_windows = info.windows("train", seq, seed=cfg.seed)
        val_windows = info.windows("val", seq, shuffle=False)
    global_seqs = t.micro_batch * accum * world
    if len(train_windows) < global_seqs:
        raise data_lib.ShardError(
            f"data={cfg.data.name} has {len(train_windows):,} training windows of {seq} tokens, fewer than one global "
            f"batch of {global_seqs:,} sequences: lower train.global_batch_tokens (or batch_size) or add data")
    vocab = 64 * math.ceil(tok.vocab_size / 64)  # padded: matmuls like multiples of 64
    batches = data_lib.TrainBatches(train_windows, t.micro_batch, accum, rank, world)

    # model and optimiser
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.backbone, cfg.pe, cfg.model, vocab).to(device)
    if ckpt is not None:  # into the whole model, before FSDP shards it
        load_weights(model, ckpt["model"], ckpt_path)
    if fsdp:
        shard_model(model, device)
    optimizer = make_optimizer(model, cfg.optim, fused=use_cuda)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.optim, steps))
    start_step, run_id = 0, None
    if ckpt is not None:
        load_optimizer_state(model, optimizer, ckpt["optimizer"], fsdp)
        scheduler.load_state_dict(ckpt["scheduler"])
        start_step, run_id = ckpt["step"], ckpt.get("wandb_id")
        if ckpt.get("stopped_at_acc") is not None and t.get("stop_acc") is not None:
            steps = start_step  # it stopped at train.stop_acc: nothing left to train
            if master:
                print(f"this run stopped at step {start_step} with accuracy {ckpt['stopped_at_acc']:.4f} >= "
                      f"train.stop_acc; nothing to do (train.stop_acc=null trains on)")
        if ckpt["world_size"] == world:
            _set_rng_state(ckpt["rng"][rank])
        elif master:
            print(f"resuming a {ckpt['world_size']}-process run on {world}: same global batches (the data order is "
                  "world-size independent); per-rank RNG streams are reseeded", file=sys.stderr)
    if ckpt is None or ckpt["world_size"] != world:
        random.seed(cfg.seed + rank)
        np.random.seed(cfg.seed + rank)
        torch.manual_seed(cfg.seed + rank)
    train_model = torch.compile(model) if t.compile else model
    skip_sync = None
    if fsdp:
        skip_sync = lambda: _fsdp_no_sync(model)  # noqa: E731
    elif distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP
        # gradient_as_bucket_view: gradients live in the all-reduce buckets (no copy in, no second copy in memory);
        # no buffer broadcast before every forward: the model's buffers are constants (RoPE tables, ALiBi slopes)
        train_model = DDP(train_model, device_ids=[local_rank] if use_cuda else None, gradient_as_bucket_view=True,
                          broadcast_buffers=False)
        skip_sync = train_model.no_sync
    bf16 = t.dtype == "bf16" or (t.dtype == "auto" and use_cuda)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()

    if master:
        (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        print(f"out_dir: {out_dir}")
    logger = Logger(cfg, out_dir, master, run_id, start_step)
    flops_tok = model.flops_per_token(seq)
    peak = peak_flops(device)
    if master:
        print(f"model: backbone={cfg.backbone.name} pe={cfg.pe.name} size={cfg.model.name}: "
              f"{model.num_params() / 1e6:.2f}M parameters ({model.num_params(True) / 1e6:.2f}M without embeddings), "
              f"vocab {tok.vocab_size} (padded {vocab})")
        if task is not None:
            print(f"data: task {task.name}: {len(task.train):,} training examples of {seq} tokens; evaluation: "
                  f"{sum(len(e.inputs) for e in task.evals):,} examples, {task.unit}s up to "
                  f"{max(e.length for e in task.evals)} (trained to {task.train_len})")
        else:
            print(f"data: {cfg.data.name}: {info.n_train_tokens:,} train / {info.n_val_tokens:,} val tokens in {info.dir}")
        print(f"train: {steps} steps x {batch_tokens:,} tokens = {steps * batch_tokens:,} tokens; "
              f"micro_batch {t.micro_batch} x grad_accum {accum} x world {world}"
              f"{' (FSDP)' if fsdp else ' (DDP)' if distributed else ''}; device {device}, "
              f"{'bf16 autocast' if bf16 else 'fp32'}" + (f"; resuming at step {start_step}" if start_step else ""))

    last_good = ckpt_path

    def diverged(step, what):
        return NonFinite(f"step {step}: {what}; stopped without checkpointing it. The last good checkpoint is "
                         f"{last_good or 'none'}" + (" (resume=auto continues from it)" if last_good else "")
                         + "; a lower optim.lr, longer optim.warmup or optim.grad_clip may help")

    def checkpoint(step, stopped_at_acc=None):
        nonlocal last_good
        # only a finite state is written: retention then never deletes the last good checkpoint for a bad one
        if not all_finite([*model.parameters(), *(v for st in optimizer.state.values() for v in st.values())],
                          distributed):
            raise diverged(step, "the weights or optimizer state are not finite")
        states = [None] * world
        if distributed:
            dist.all_gather_object(states, _rng_state())
        else:
            states = [_rng_state()]
        model_sd, optim_sd = model_state(model, fsdp), optimizer_state(model, optimizer, fsdp)
        last_good = out_dir / "checkpoints" / f"step_{step:07d}.pt"
        if master:
            save_checkpoint(out_dir / "checkpoints", step, {
                "step": step, "model": model_sd, "optimizer": optim_sd, "strategy": "fsdp" if fsdp else "ddp",
                "scheduler": scheduler.state_dict(), "rng": states, "world_size": world,
                "data_position": {"next_step": step, "samples_seen": step * batches.global_batch},
                "config": OmegaConf.to_container(cfg, resolve=True), "tokenizer": tok.to_dict(),
                "vocab_size": vocab, "wandb_id": logger.run_id, "stopped_at_acc": stopped_at_acc},
                t.keep_checkpoints)

    def micro_batches(step):
        for micro in range(accum):
            batch = batches.get(step, micro)
            if t.get("doc_boundaries"):  # boundaries found on the host: no sync
                batch = data_lib.pack_documents(*batch, tok.eot_id)
            if use_cuda:  # from pinned memory the copy is asynchronous: the host runs ahead of the GPU
                batch = [b.pin_memory() for b in batch]
            yield tuple(b.to(device, non_blocking=True) for b in batch)

    from tqdm import tqdm
    bar = tqdm(total=steps, initial=start_step, disable=not (master and t.progress), unit="step", dynamic_ncols=True,
               file=sys.stdout)
    n_val = max(1, t.eval_tokens // seq)
    result = {}
    t_last, tokens_since, steps_since = time.perf_counter(), 0, 0
    loss_sum = torch.zeros((), device=device)
    profiler = Profiler(t.profile_steps, out_dir, master, device) if t.profile_steps else None
    t_start, paused = time.perf_counter(), False

    def out_of_time():  # rank 0's clock decides for all (ranks that disagreed would wait on each other forever)
        flag = torch.tensor(float(time.perf_counter() - t_start > t.time_limit), device=device)
        if distributed:
            dist.broadcast(flag, 0)
        return bool(flag.item())

    for step in range(start_step, steps):
        if profiler is not None:
            profiler.step(step - start_step)
        lr = scheduler.get_last_lr()[0]
        loss, grad_norm = train_step(train_model, micro_batches(step), accum, optimizer, scheduler, autocast,
                                     cfg.optim.grad_clip, skip_sync)
        loss_sum += loss
        tokens_since += batch_tokens
        steps_since += 1
        done = step + 1
        bar.update(1)

        if done % t.log_interval == 0 or done == steps:
            if distributed:
                dist.all_reduce(loss_sum)
                loss_sum /= world
            if device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t_last
            tps = tokens_since / dt
            row = {"step": done, "loss": loss_sum.item() / steps_since, "lr": lr, "grad_norm": grad_norm.item(),
                   "tokens_per_s": tps, "mfu": flops_tok * tps / (peak * world) if peak else None,
                   "tokens": done * batch_tokens,
                   "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2 ** 30 if use_cuda else None}
            logger.log(row)
            if not (math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])):
                raise diverged(done, f"loss {row['loss']}, gradient norm {row['grad_norm']}")
            mfu = f" mfu {row['mfu']:.3f}" if row["mfu"] else ""
            bar.set_postfix(loss=f"{row['loss']:.3f}")
            if master:
                bar.write(f"step {done:6d} | loss {row['loss']:.4f} | lr {lr:.2e} | grad {row['grad_norm']:.2f} | "
                          f"{tps:,.0f} tok/s{mfu}")
            result.update(row)
            loss_sum.zero_()
            t_last, tokens_since, steps_since = time.perf_counter(), 0, 0
        if (done % t.eval_interval == 0 or done == steps) and task is not None:
            m = tasks.evaluate(model, task, t.micro_batch, device, autocast, rank, world)
            logger.log({"step": done, **{k: v for k, v in m.items() if not k.startswith("curve")},
                        **tasks.log_points(m["curve"], task.train_len)})
            if master:
                bar.write(f"step {done:6d} | {tasks.summary(m, task)}")
            result.update(m)
            t_last = time.perf_counter()
            acc = tasks.headline(m)  # every rank computed the same all-reduced number
            if t.get("stop_acc") is not None and done < steps and acc >= t.stop_acc:
                if master:  # the seed's code stops at 0.99
                    bar.write(f"step {done:6d} | accuracy {acc:.4f} >= train.stop_acc={t.stop_acc}: stopping")
                checkpoint(done, acc)
                steps = done
                break
        elif done % t.eval_interval == 0 or done == steps:
            val = evaluate(model, val_windows, n_val, t.micro_batch, device, autocast, rank, world,
                           tok.eot_id if t.get("doc_boundaries") else None)
            logger.log({"step": done, "val_loss": val, "val_ppl": math.exp(min(val, 50))})
            if master:
                bar.write(f"step {done:6d} | val loss {val:.4f} | val ppl {math.exp(min(val, 50)):.2f}")
            result.update(val_loss=val)
            t_last = time.perf_counter()  # evaluation time is not training throughput
        if done % t.ckpt_interval == 0 or done == steps:
            checkpoint(done)
            t_last = time.perf_counter()
        if t.get("time_limit") and done % t.log_interval == 0 and done < steps and out_of_time():
            if done % t.ckpt_interval:
                checkpoint(done)  # a pause, not an end: resume=auto goes on from here
            paused = True
            if master:
                bar.write(f"step {done:6d} | train.time_limit={t.time_limit} s reached: checkpointed; run again "
                          "(resume=auto) to go on")
            break
    bar.close()
    if profiler is not None:
        profiler.close()

    if master and task is not None and "curve" in result and not paused:
        summary = {"task": task.name, "train_len": task.train_len, "unit": task.unit, "step": steps,
                   **{k: result.get(k) for k in ("val_loss", "val_acc", "val_acc_extrap", "val_seq_acc",
                                                 "val_seq_acc_extrap") if k in result},
                   "tokens": steps * batch_tokens, "curve": result["curve"],
                   **({"curve_seq": result["curve_seq"]} if "curve_seq" in result else {}),
                   "config": OmegaConf.to_container(cfg, resolve=True)}
        tasks.write_result(out_dir / "task_eval.json", summary)
        tasks.plot_curves(tasks.labelled_curves(f"{cfg.backbone.name} + {cfg.pe.name}", result), out_dir /
                          "accuracy_vs_length.png", task.train_len, task.unit, title=f"{task.name}: {cfg.run_name}")
        print(f"accuracy vs {task.unit}: {out_dir / 'accuracy_vs_length.png'}")
    # FSDP: every rank runs the sampling forwards (each gathers parameters), the same tokens from the same seed
    if (master or fsdp) and task is None and t.sample_tokens > 0 and steps > start_step and not paused:
        model.eval()
        prompt = torch.tensor([tok.encode(t.sample_prompt) or [tok.eot_id]], device=device)
        try:
            with autocast:
                out = model.generate(prompt, t.sample_tokens, temperature=0.8, top_k=50,
                                     generator=torch.Generator(device).manual_seed(cfg.seed))
            result["sample"] = tok.decode(out[0].tolist())
        except RuntimeError as e:  # logits that overflow (a diverged model) make no distribution to sample
            if "probability tensor" not in str(e):
                raise
            print(f"sample: skipped, the model's next-token probabilities are not finite (loss "
                  f"{result.get('loss')})", file=sys.stderr)
        if master and "sample" in result:
            print("sample:", repr(result["sample"]))
    logger.close()
    if distributed:
        # DDP's reducer first: were it to drop the last reference to the gloo process group, the group's destructor
        # would join gloo's worker threads while holding the GIL, and a worker that still frees the tensors of the
        # last collective needs the GIL (a deadlock seen on loaded CPU machines). The group object releases it.
        # skip_sync is DDP's bound no_sync: it holds the wrapper too.
        train_model = skip_sync = None
        dist.destroy_process_group()
    return result


def cli(run_fn, config_name: str):
    """Hydra entry point shared with eval.py: bad input ends in one `error: ...` line and exit code 2."""
    import hydra

    # an absolute path: with the repo pip-installed, eval.py reaches this through the module `train`, and Hydra
    # would read a relative config_path as a Python package
    @hydra.main(config_path=str(Path(__file__).resolve().parent / "conf"), config_name=config_name, version_base="1.3")
    def _main(cfg):
        from data import ShardError
        try:
            return run_fn(cfg)
        except (ConfigError, ShardError, FileNotFoundError, NonFinite) as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)

    _main()


def main():
    cli(run, "config")


if __name__ == "__main__":
    main()
