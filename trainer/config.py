"""Everything about a run's config that can be checked before any work starts, and the numbers it derives (steps,
gradient accumulation, tokens per step)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import torch

from duality.common.errors import ConfigError
from duality.data.tasks import is_task
from duality.model import check_model_config
from duality.model.gpt import AC_MODES, COMPILE_MODES, COMPILE_SCOPES

from .checkpoint import FORMATS as CHECKPOINT_FORMATS
from .guard import MODES as NONFINITE
from .logger import LOGGER_MODES
from .optim import SCHEDULES

STRATEGIES = ("ddp", "fsdp")
DTYPES = ("auto", "bf16", "fp32", "bf16_weights")
FLOAT8 = ("none", "tensorwise", "rowwise")  # train.float8: torchao's scaling recipes


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_optim(o) -> None:
    """The optimiser's values in their valid ranges: a negative clip or decay trains wrongly without an error
    (grad_clip=-1 scaled every gradient by -1: gradient ascent)."""
    checks = (("grad_clip", o.get("grad_clip"), lambda v: v is None or (_number(v) and v > 0), "a number > 0, or null"),
              ("weight_decay", o.get("weight_decay"), lambda v: _number(v) and v >= 0, "a number >= 0"),
              ("warmup", o.get("warmup"), lambda v: _number(v) and v >= 0,
               "a number >= 0 (a fraction of the steps if < 1, else steps)"),
              ("eps", o.get("eps"), lambda v: _number(v) and v > 0, "a number > 0"),
              ("min_lr_ratio", o.get("min_lr_ratio"), lambda v: _number(v) and 0 <= v <= 1, "a number in [0, 1]"),
              ("decay_fraction", o.get("decay_fraction"), lambda v: _number(v) and 0 <= v <= 1, "a number in [0, 1]"),
              ("betas", o.get("betas"), lambda v: v is not None and len(v) == 2 and all(_number(b) and 0 <= b < 1
                                                                                        for b in v),
               "two numbers in [0, 1), e.g. [0.9, 0.95]"))
    for key, value, ok, what in checks:
        try:
            good = ok(value)
        except TypeError:
            good = False
        if not good:
            raise ConfigError(f"optim.{key}={value!r}: {what}")


def given(key: str) -> bool:
    """Whether the command line set `key` (Hydra's overrides); outside a Hydra app (a config composed in code) every
    value counts as given."""
    try:
        from hydra.core.hydra_config import HydraConfig
    except ImportError:
        return True
    if not HydraConfig.initialized():
        return True
    return any(o.lstrip("+~").split("=")[0] == key for o in HydraConfig.get().overrides.task)


def check_known_keys(cfg) -> None:
    """`+train.stepz=1` adds a key nothing reads: refused, with the nearest known key. The train and optim groups'
    keys are those of conf/train/tiny.yaml (every size extends it) and conf/optim/adamw.yaml."""
    import difflib

    from omegaconf import OmegaConf
    conf = Path(__file__).resolve().parent.parent / "conf"
    for group, path in (("train", conf / "train" / "tiny.yaml"), ("optim", conf / "optim" / "adamw.yaml")):
        known = set(OmegaConf.load(path))
        for key in sorted(set(cfg[group]) - known):
            near = difflib.get_close_matches(key, sorted(known), n=1)
            raise ConfigError(f"{group}.{key} is not a {group} setting" + (f"; did you mean {group}.{near[0]}?"
                                                                            if near else "")
                              + f" (the settings: conf/{group}/{path.name})")


# data.* counts and their least valid value (null, where a config allows it, means "all" or "the default");
# val_every 1 would hold out every document and train on none
DATA_COUNTS = {"vocab_size": 1, "seq_len": 1, "eval_len": 1, "train_examples": 1, "test_examples": 1, "val_every": 2,
               "shard_tokens": 1, "max_docs": 1, "bpe_docs": 1, "workers": 1, "num_kv_pairs": 1, "doc_len": 1,
               "min_len": 1, "max_len": 1, "noise_vocab_size": 0, "num_tokens_to_copy": 0}


def check_data_ranges(data) -> None:
    """What the integer checks of check_config cannot say: the data's lengths in order, a fraction in range."""
    if (data.get("min_len") or 1) > (data.get("max_len") or math.inf):
        raise ConfigError(f"data.min_len={data.min_len} > data.max_len={data.max_len}")
    frac = data.get("frac_noise")
    if frac is not None and not (_number(frac) and 0 <= frac < 1):
        raise ConfigError(f"data.frac_noise={frac!r}: a number in [0, 1)")


def check_context_parallel(cfg, world: int) -> int:
    """train.context_parallel: how many ranks split each sequence (1: none), checked against the world and the run."""
    cp = cfg.train.get("context_parallel", 1)
    if not isinstance(cp, int) or isinstance(cp, bool) or cp < 1:
        raise ConfigError(f"train.context_parallel={cp!r}: an integer >= 1")
    if cp == 1:
        return 1
    why = [f"the world size ({world}) is not a multiple of it" if world % cp else "",
           f"model.seq_len={cfg.model.seq_len} does not split into {cp} equal slices" if cfg.model.seq_len % cp else "",
           "synthetic tasks are not split yet" if is_task(cfg.data) else ""]
    if any(why):
        raise ConfigError(f"train.context_parallel={cp}: " + "; ".join(w for w in why if w))
    return cp


def check_config(cfg, world: int = 1) -> dict:
    """Everything that can be checked before any work; returns derived numbers (steps, grad_accum)."""
    t, o = cfg.train, cfg.optim
    check_known_keys(cfg)
    for key, value, low in (("model.n_layer", cfg.model.n_layer, 1), ("model.seq_len", cfg.model.seq_len, 1),
                            ("train.micro_batch", t.micro_batch, 1), ("train.log_interval", t.log_interval, 1),
                            ("train.eval_interval", t.eval_interval, 1), ("train.ckpt_interval", t.ckpt_interval, 1),
                            ("train.keep_checkpoints", t.keep_checkpoints, 0), ("train.eval_tokens", t.eval_tokens, 1),
                            ("train.sample_tokens", t.sample_tokens, 0),
                            *((f"train.{k}", t[k], 1) for k in ("steps", "batch_size", "global_batch_tokens")
                              if t.get(k) is not None),
                            *((f"data.{k}", cfg.data[k], low) for k, low in DATA_COUNTS.items()
                              if cfg.data.get(k) is not None)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ConfigError(f"{key}={value!r}: an integer >= {low}" + (" (or null)" if key == "train.steps" else ""))
    budgets = ((f"train.{k}", t[k]) for k in ("tokens", "epochs") if t.get(k) is not None)
    for key, value in (("optim.lr", o.lr), *budgets):
        if not _number(value) or value < 0:
            raise ConfigError(f"{key}={value!r}: a number >= 0")
    for key, hi, what in (("time_limit", math.inf, "seconds > 0"), ("stop_acc", 1, "an accuracy in (0, 1]")):
        v = t.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= hi):
            raise ConfigError(f"train.{key}={v!r}: {what}, or null")
    check_optim(o)
    if cfg.model.get("mlp_impl") == "quack" and torch.cuda.is_available():
        from duality.model.core.layers import quack_available
        if not quack_available():
            raise ConfigError("model.mlp_impl=quack needs the quack-kernels package on this CUDA machine (pip install "
                              "quack-kernels); model.mlp_impl=inductor runs without it")
    check_data_ranges(cfg.data)
    if o.lr == 0:
        print("warning: optim.lr=0: the weights will not change", file=sys.stderr)
    check_model_config(dict(cfg.backbone), dict(cfg.pe), dict(cfg.model))
    seq = cfg.model.seq_len
    world = world // check_context_parallel(cfg, world)  # the ranks that see different sequences
    if t.get("batch_size"):  # in sequences (synthetic tasks); global_batch_tokens is then derived
        per_micro = t.micro_batch * world
        if t.batch_size % per_micro:
            raise ConfigError(f"train.batch_size={t.batch_size} is not a multiple of micro_batch x world_size = "
                              f"{t.micro_batch} x {world}; e.g. "
                              f"batch_size={max(1, round(t.batch_size / per_micro)) * per_micro}")
        accum, batch_tokens = t.batch_size // per_micro, t.batch_size * seq
    else:
        per_micro = t.micro_batch * seq * world
        if (t.global_batch_tokens % per_micro and world > 1 and not given("train.global_batch_tokens")
                and not given("train.micro_batch")):
            # the size's defaults on more ranks than the default micro-batch divides the batch over: a smaller
            # micro-batch keeps the global batch, so the run is the one a single GPU makes (issue #76: 2 ranks ran
            # 4,096-token batches where 1 ran 2,048)
            fits = [m for m in range(t.micro_batch - 1, 0, -1) if t.global_batch_tokens % (m * seq * world) == 0]
            if fits:
                if os.environ.get("RANK", "0") == "0":
                    print(f"note: train.micro_batch {t.micro_batch} -> {fits[0]}, so that the global batch of "
                          f"{t.global_batch_tokens} tokens divides over {world} ranks (the run a single GPU makes; "
                          "set train.micro_batch to choose)", file=sys.stderr)
                t.micro_batch = fits[0]
                per_micro = t.micro_batch * seq * world
        if t.global_batch_tokens % per_micro and world > 1 and not given("train.global_batch_tokens"):
            # the size's default batch on more GPUs than it divides over: the next multiple, said once
            adapted = -(-t.global_batch_tokens // per_micro) * per_micro
            if os.environ.get("RANK", "0") == "0":
                print(f"note: train.global_batch_tokens {t.global_batch_tokens} -> {adapted}, a multiple of "
                      f"micro_batch x seq_len x world_size = {t.micro_batch} x {seq} x {world} (set it to choose "
                      "another)", file=sys.stderr)
            t.global_batch_tokens = adapted
        if t.global_batch_tokens % per_micro:
            raise ConfigError(
                f"train.global_batch_tokens={t.global_batch_tokens} is not a multiple of micro_batch x seq_len x "
                f"world_size = {t.micro_batch} x {seq} x {world} = {per_micro}; e.g. global_batch_tokens="
                f"{max(1, round(t.global_batch_tokens / per_micro)) * per_micro}")
        accum, batch_tokens = t.global_batch_tokens // per_micro, t.global_batch_tokens
    if t.get("epochs") and t.steps is not None:  # both given, one would be ignored without a word
        raise ConfigError(f"train.steps={t.steps} and train.epochs={t.epochs} both set the budget; keep one and set "
                          f"the other to null (e.g. train.epochs=null train.steps={t.steps})")
    if t.get("epochs") and not is_task(cfg.data):
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
    if t.dtype not in DTYPES:
        raise ConfigError(f"train.dtype={t.dtype!r}; valid choices: {list(DTYPES)}")
    if t.dtype == "bf16_weights" and 1 - o.betas[1] < 2 ** -8:
        # bf16 rounds away a change of v under half the gap to its neighbours, 2^-9 .. 2^-8 of v by its mantissa:
        # v * beta2 is v again for some v once 1 - beta2 < 2^-8, for every v once < 2^-9 (0.999: 0.001)
        print(f"warning: train.dtype=bf16_weights keeps AdamW's state in bf16, where v * beta2 (optim.betas[1]="
              f"{o.betas[1]}) rounds back to v: the second moment never decays, and once the gradients shrink the "
              "steps round away and the weights stop moving (docs/synthetic, \"S2's extrapolation gap\"; "
              "scripts/frozen_weights.py checks a run)", file=sys.stderr)
    if not isinstance(t.get("profile_steps", 0), int) or t.get("profile_steps", 0) < 0:
        raise ConfigError(f"train.profile_steps={t.profile_steps!r}: the number of steps to profile, an integer >= 0")
    if not isinstance(t.get("profile_after", 3), int) or t.get("profile_after", 3) < 0:
        raise ConfigError(f"train.profile_after={t.profile_after!r}: the steps before profiling, an integer >= 0")
    if t.get("nonfinite", "stop") not in NONFINITE:
        raise ConfigError(f"train.nonfinite={t.nonfinite!r}; valid choices: {list(NONFINITE)}")
    if t.get("activation_checkpointing", "none") not in AC_MODES:
        raise ConfigError(f"train.activation_checkpointing={t.activation_checkpointing!r}; valid choices: "
                          f"{list(AC_MODES)}")
    if t.get("compile_mode", "default") not in COMPILE_MODES:
        raise ConfigError(f"train.compile_mode={t.compile_mode!r}; valid choices: {list(COMPILE_MODES)}")
    if t.get("compile_scope", "blocks") not in COMPILE_SCOPES:
        raise ConfigError(f"train.compile_scope={t.compile_scope!r}; valid choices: {list(COMPILE_SCOPES)}")
    if t.get("strategy", "ddp") not in STRATEGIES:
        raise ConfigError(f"train.strategy={t.strategy!r}; valid choices: {list(STRATEGIES)}")
    if t.get("fsdp_reshard", "auto") not in ("auto", True, False):
        raise ConfigError(f"train.fsdp_reshard={t.fsdp_reshard!r}; valid choices: auto, true, false")
    k = t.get("fsdp_prefetch", 1)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ConfigError(f"train.fsdp_prefetch={t.fsdp_prefetch!r}; valid choices: 0 (FSDP2's own order) or the "
                          "number of blocks to gather ahead (1, 2, ...)")
    if t.get("float8", "none") not in FLOAT8:
        raise ConfigError(f"train.float8={t.float8!r}; valid choices: {list(FLOAT8)}")
    if t.get("fsdp_param_dtype", "float32") not in ("float32", "bfloat16"):
        raise ConfigError(f"train.fsdp_param_dtype={t.fsdp_param_dtype!r}; valid choices: float32, bfloat16")
    if t.get("fsdp_param_dtype", "float32") == "bfloat16" and t.get("strategy", "ddp") != "fsdp":
        raise ConfigError(f"train.fsdp_param_dtype=bfloat16 is FSDP2's: it needs train.strategy=fsdp (got "
                          f"{t.get('strategy', 'ddp')})")
    if t.get("checkpoint_format", "full") not in CHECKPOINT_FORMATS:
        raise ConfigError(f"train.checkpoint_format={t.checkpoint_format!r}; valid choices: {list(CHECKPOINT_FORMATS)}")
    if t.get("async_checkpoint") and t.get("checkpoint_format", "full") != "sharded":
        raise ConfigError("train.async_checkpoint=true needs train.checkpoint_format=sharded (a full checkpoint is "
                          "gathered to rank 0 and written at once)")
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
