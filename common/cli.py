"""The Hydra entry point of train.py, eval.py and data/prepare.py: bad input ends in one `error: ...` line and exit
code 2, never a traceback."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from .errors import USER_ERRORS, ConfigError, describe_storage, storage_cause

CONF = Path(__file__).resolve().parent.parent / "conf"


HELP = {
    "config": ("train.py: train a GPT whose token mixer and positional scheme come from the config.\n"
               "  python train.py backbone=gla pe=selective_rope model=370m data=fineweb\n"
               "  torchrun --nproc_per_node=8 train.py model=124m data=fineweb"),
    "eval": ("eval.py: evaluate checkpoints or exports (mode=perplexity | sample | task | lm_eval | position_loss |\n"
             "kernel | export).\n  python eval.py ckpt=outputs/gla-rope-370m mode=perplexity"),
    "prepare": "data/prepare.py: prepare a data config's shards ahead of training.\n"
               "  python data/prepare.py data=fineweb data.sample=sample-10BT data.workers=32",
}
FOOTER = "Recipes and every option: README.md and docs/ in the repository."


def help_text(what: str, config_name: str) -> str:
    """--help's parts: the groups of conf/ and their choices (the schemas that validate them left out), and a header
    and footer that say what the script does."""
    if what == "GROUPS":
        return "\n".join(f"{g.name}: {', '.join(sorted(p.stem for p in g.glob('*.yaml')))}"
                         for g in sorted(CONF.iterdir()) if g.is_dir() and any(g.glob("*.yaml")))
    return HELP.get(config_name, HELP["config"]) if what == "HEADER" else FOOTER


def check_choices(args: list[str]) -> str | None:
    """Why a `group=choice` argument names no config of conf/<group>/ (None: they all do), with close matches: Hydra
    lists every option, the internal `<name>_schema` entries among them, and `pe=alibi_schema` trained. A sweep's
    comma list is checked choice by choice; Hydra's sweep functions (`choice(...)`, `glob(...)`) are left to it."""
    import difflib
    for arg in args:
        key, eq, value = arg.lstrip("+~").partition("=")
        folder = CONF / key
        if not eq or "." in key or key.startswith("hydra/") or not folder.is_dir() or "(" in value:
            continue
        valid = sorted(p.stem for p in folder.glob("*.yaml"))
        for v in value.split(","):
            if v and v != "null" and v not in valid:
                close = difflib.get_close_matches(v, valid, n=3)
                hint = f"did you mean {' or '.join(close)}? " if close else ""
                return f"{key}={v}: no such {key} config; {hint}valid choices: {', '.join(valid)}"
    return None


def _register_launcher():
    """hydra/launcher=gpus (hydra_plugins/duality_launcher): Hydra finds plugins by listing the hydra_plugins
    namespace's folders, which misses a package installed in editable mode (pip install -e: an import hook, not a
    folder), so it is added to Hydra's table by name; a regular install is found either way."""
    from hydra.core.plugins import Plugins
    try:
        from hydra_plugins.duality_launcher.gpus import GPUsLauncher
    except ImportError:
        # the repo on PYTHONPATH without an install: duality/__init__ took the root off sys.path, so the plugin is
        # read from there, the root back off after (Hydra said only "Unknown plugin class" for hydra/launcher=gpus)
        sys.path.append(str(CONF.parent))
        try:
            from hydra_plugins.duality_launcher.gpus import GPUsLauncher
        except ImportError:  # not there either: train.py runs, hydra/launcher=gpus is not offered
            return
        finally:
            sys.path.remove(str(CONF.parent))

    name = f"{GPUsLauncher.__module__}.{GPUsLauncher.__name__}"
    Plugins.instance().class_name_to_class.setdefault(name, GPUsLauncher)


# what gloo and NCCL say when the process at the other end of a collective is gone
LOST_PEER = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted",
             "remote process exited or there was a network error")


def lost_peer(e: BaseException) -> bool:
    """A collective failed because another rank's process ended (kill -9, the OOM killer): under torchrun only."""
    return "LOCAL_RANK" in os.environ and any(m in str(e) for m in LOST_PEER)


def _best_lr(metric: str, *, _root_) -> float:
    """`${best_lr:val_acc}`: the best learning rate of this job's pair in its sweep's seed-0 grid (common/grid.py)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from .grid import best_lr
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        raise ConfigError("optim.lr=${best_lr:...} is a results sweep's seeds' learning rate, read from its grid's "
                          "runs: run it as a sweep (python train.py -m sweep=results_<task>_seeds), or give optim.lr")
    hc = HydraConfig.get()  # hydra/launcher=gpus's record: the results record the sweep continues from
    return best_lr(hc.sweep.dir, f"{_root_.backbone.name}-{_root_.pe.name}", metric, hc.launcher.get("record"))


RANK0_GRACE_S = 30  # how long another rank with a config error waits for rank 0 to say it and exit


def cli(run_fn, config_name: str, script: str | None = None):
    import hydra
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    OmegaConf.register_new_resolver("duality_help", lambda what: help_text(what, script or config_name), replace=True)
    OmegaConf.register_new_resolver("best_lr", _best_lr, replace=True)
    _register_launcher()
    if why := check_choices(sys.argv[1:]):
        print(f"error: {why}", file=sys.stderr)
        sys.exit(2)

    # an absolute path: with the repo pip-installed, Hydra would read a relative config_path as a Python package
    @hydra.main(config_path=str(CONF), config_name=config_name, version_base="1.3")
    def _main(cfg):
        os.environ["DUALITY_CLI"] = "1"  # the process ends with this run (trainer/preempt.py: StopSignals.close)
        try:
            try:
                return run_fn(cfg)
            except OmegaConfBaseException as e:  # a resolver's own error (best_lr's), which OmegaConf re-raises
                first = str(e).splitlines()[0]     # as its own type, keeping only the message
                kind, _, why = first.partition(" raised while resolving interpolation: ")
                if why and kind in {c.__name__ for c in USER_ERRORS}:
                    raise ConfigError(why) from None
                raise
        except USER_ERRORS as e:
            # a config error is every rank's under torchrun: rank 0 says it; other errors may be one rank's own
            if os.environ.get("RANK", "0") == "0" or not isinstance(e, ConfigError):
                print(f"error: {e}", file=sys.stderr)
            else:  # torchrun stops every process once one exits: a rank that exited first cut rank 0 off before its
                time.sleep(RANK0_GRACE_S)  # line (a loaded 2-core CI machine); rank 0's exit ends this wait at once
            sys.exit(2)
        except (OSError, RuntimeError) as e:  # a place that cannot be written: one line, the path and the cause
            if lost_peer(e):
                print(f"error: rank {os.environ.get('RANK', '?')}: another process of this run ended (killed, or out "
                      "of memory): its collective failed here. torchrun stops the others and names the lost rank "
                      "below ('Root Cause'); run again (resume=auto) to go on from the last checkpoint",
                      file=sys.stderr)
                sys.exit(1)
            if (cause := storage_cause(e)) is None:
                raise
            print(f"error: {describe_storage(cause)}", file=sys.stderr)
            sys.exit(2)

    _main()
