"""What a run reports: every logged row to out_dir/metrics.jsonl, the same to wandb (offline without credentials),
a line to the console; and the throughput numbers of those rows (tokens/s, MFU)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from duality.common.errors import StorageError
from duality.common.io import write_atomic

LOGGER_MODES = ("auto", "online", "offline", "disabled")
# Dense bf16 peak FLOP/s per device, for MFU. Matched by substring of torch.cuda.get_device_name().
PEAK_FLOPS = {
    "H200": 989e12, "H100": 989e12, "H800": 989e12, "GH200": 989e12, "B200": 2250e12, "B100": 1750e12,
    "A100": 312e12, "A800": 312e12, "L40S": 362e12, "L40": 181e12, "A6000": 155e12, "A40": 150e12,
    "L4": 121e12, "A10G": 70e12, "A10": 125e12, "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12,
}


def sweep_config():
    """Hydra's config of this job when it is one job of a multirun sweep, else None."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
    except ImportError:
        return None
    return HydraConfig.get() if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN else None


def default_out_dir(cfg) -> Path:
    """outputs/<run_name>, or in a Hydra multirun the job's own sweep folder (so sweep jobs never share one)."""
    sweep = sweep_config()
    return Path(sweep.runtime.output_dir) if sweep else Path("outputs") / cfg.run_name


class Logger:
    """metrics.jsonl always; wandb when enabled (offline without credentials); console through tqdm."""

    def __init__(self, cfg, out_dir: Path, enabled: bool, run_id: str | None, start_step: int = 0):
        self.enabled, self.wandb, self.wandb_from = enabled, None, 0
        if enabled:
            self._truncate(out_dir / "metrics.jsonl", start_step)
        self.path = out_dir / "metrics.jsonl"
        self.file = open(self.path, "a") if enabled else None
        self.inode = os.fstat(self.file.fileno()).st_ino if enabled else None
        if not enabled or cfg.logger.mode == "disabled":
            return
        from omegaconf import OmegaConf
        sweep = sweep_config()  # a sweep's jobs share a wandb group named after its folder, unless logger.group says
        lg = cfg.logger
        self.wandb = wandb_init(lg.mode, project=lg.project, entity=lg.entity, name=lg.get("run_name"),
                                group=lg.group, dir=lg.get("dir"), tags=list(lg.tags),
                                defaults={"name": cfg.run_name, "dir": str(out_dir),
                                          "group": Path(sweep.sweep.dir).name if sweep else None},
                                id=run_id, resume="allow", config=OmegaConf.to_container(cfg, resolve=True))
        # a resumed wandb run refuses steps below its last one (the crashed attempt logged them): do not send them
        self.wandb_from = self.wandb.step if run_id and self.wandb is not None else 0

    @staticmethod
    def _truncate(path: Path, step: int):
        """Drop the rows after `step` (what a killed run logged past its last checkpoint), atomically: the resumed
        run logs those steps again, and the file keeps one row per step and kind."""
        if not path.exists():
            return
        # bytes that are not UTF-8 (a line garbled on disk) become U+FFFD: their line fails to parse and goes
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        def row(ln):
            try:
                r = json.loads(ln)
            except ValueError:
                return None  # a line cut short by the kill
            return r if isinstance(r, dict) else None
        keep = [ln for ln in lines if (r := row(ln)) is not None and r.get("step", 0) <= step]
        if len(keep) != len(lines):
            write_atomic(path, "".join(ln + "\n" for ln in keep))

    @property
    def run_id(self):
        return self.wandb.id if self.wandb is not None else None

    def log(self, row: dict):
        if not self.enabled:
            return
        try:  # the file this run writes is still the one at its path: out_dir was not removed or replaced
            here = os.stat(self.path).st_ino
        except FileNotFoundError:
            here = None
        if here != self.inode:
            raise StorageError(f"{self.path.parent} was {'removed' if here is None else 'replaced'} while this run "
                               f"was writing to it (noticed at step {row['step']}): its checkpoints and metrics "
                               "there are gone, and this run writes nothing into a folder it no longer holds; "
                               "stopping. Start again, in a new out_dir or with resume=auto where a checkpoint is")
        try:
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()
        except OSError as e:  # a full disk: the error names the file (train.py then says it in one line)
            raise OSError(e.errno, e.strerror, str(self.path)) from e
        if self.wandb is not None and row["step"] >= self.wandb_from:
            self.wandb.log({k: v for k, v in row.items() if k != "step" and v is not None}, step=row["step"])

    def close(self):
        if self.file:
            self.file.close()
        if self.wandb is not None:
            self.wandb.finish()


class StepMeter:
    """The numbers of a log row: the mean loss since the last row (averaged over ranks), tokens/s, MFU, peak memory.
    Losses stay on the device between rows: only a row waits for the GPU."""

    def __init__(self, rt, batch_tokens: int, flops_per_token: float):
        self.rt, self.batch_tokens, self.flops_per_token = rt, batch_tokens, flops_per_token
        self.peak = peak_flops(rt.device)
        self.loss_sum, self.steps = torch.zeros((), device=rt.device), 0
        self.restart()

    def restart(self):
        """Start the throughput clock again (after an evaluation or a checkpoint, which are not training); the loss
        mean still counts every step since the last row."""
        self.t0, self.tokens = time.perf_counter(), 0

    def add(self, loss: torch.Tensor | None):
        """One step's loss; None for a skipped step (trainer/guard.py): its tokens count for throughput, its
        non-finite loss not in the mean."""
        self.tokens += self.batch_tokens
        if loss is not None:
            self.loss_sum += loss
            self.steps += 1

    def row(self, step: int, lr: float, grad_norm: torch.Tensor) -> dict:
        rt = self.rt
        rt.mean(self.loss_sum)
        if rt.cuda:
            torch.cuda.synchronize()
        tps = self.tokens / (time.perf_counter() - self.t0)
        row = {"step": step, "loss": self.loss_sum.item() / self.steps if self.steps else math.nan, "lr": lr,
               "grad_norm": grad_norm.item(), "tokens_per_s": tps,
               "mfu": self.flops_per_token * tps / (self.peak * rt.world) if self.peak else None,
               "tokens": step * self.batch_tokens,
               "peak_mem_gib": torch.cuda.max_memory_allocated(rt.device) / 2 ** 30 if rt.cuda else None}
        self.loss_sum.zero_()
        self.steps = 0
        self.restart()
        return row

    @staticmethod
    def line(row: dict) -> str:
        mfu = f" mfu {row['mfu']:.3f}" if row["mfu"] else ""
        return (f"loss {row['loss']:.4f} | lr {row['lr']:.2e} | grad {row['grad_norm']:.2f} | "
                f"{row['tokens_per_s']:,.0f} tok/s{mfu}")


# wandb's own variables, each beside the wandb.init argument it sets: where a user's environment says one, it wins
# over this repo's default; a value given in the config (logger.project=..., not null) wins over both
WANDB_ENV = {"project": "WANDB_PROJECT", "entity": "WANDB_ENTITY", "name": "WANDB_NAME", "group": "WANDB_RUN_GROUP",
             "dir": "WANDB_DIR"}
WANDB_MODES = {"online": "online", "run": "online", "offline": "offline", "dryrun": "offline", "disabled": "disabled"}


def wandb_mode(mode: str) -> str:
    """logger.mode as given, or for auto: WANDB_MODE where set, else online with credentials, else offline."""
    if mode != "auto":
        return mode
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    if env in WANDB_MODES:
        return WANDB_MODES[env]
    return "online" if (os.environ.get("WANDB_API_KEY") or wandb_logged_in()) else "offline"


def wandb_init(mode: str, defaults: dict, **kw):
    """wandb.init with the environment honoured (WANDB_ENV, wandb_mode); None when the mode is disabled. A server
    that cannot be reached is one warning line and an offline run (`wandb sync` sends it later), never a lost run."""
    mode = wandb_mode(mode)
    if mode == "disabled":
        return None
    import wandb
    defaults = {"project": "duality", **defaults}
    for key, var in WANDB_ENV.items():  # config value, else the environment's, else this repo's default
        kw[key] = kw.get(key) or os.environ.get(var) or defaults.get(key)
    if kw.get("dir"):
        Path(kw["dir"]).mkdir(parents=True, exist_ok=True)
    try:
        return wandb.init(mode=mode, **kw)
    except Exception as e:  # wandb raises its CommError, timeouts and more from one call: all mean "not reached"
        if mode != "online":
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        print(f"warning: wandb could not reach its server ({type(e).__name__}: {first}); logging offline instead, "
              f"under {kw.get('dir')} (wandb sync sends it later)", file=sys.stderr, flush=True)
        return wandb.init(mode="offline", **kw)


def wandb_logged_in() -> bool:
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.exists() and "api.wandb.ai" in netrc.read_text()


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)
