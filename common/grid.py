"""The learning rate a results sweep's later seeds train at: the best of the grid that seed 0 ran (docs/results/).

A grid sweep writes each run to `<sweep dir>/<backbone>-<pe>/lr<lr>-s0/`; a finished run leaves task_eval.json there,
a diverged one nonfinite.json (trainer/guard.py: train.nonfinite=stop ended it). `best_lr` reads those of one pair and
returns the lr whose run scored best at the training length (the metric named, ties to the lower validation loss; a
diverged lr ranks below every finished one), so the choice never looks at the lengths the study extrapolates to.
The seeds sweep reads it through the config: `optim.lr: ${best_lr:val_acc}` (common/cli.py registers the resolver).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from hydra_plugins.duality_launcher.gpus import OVER, error_line, record_runs

from .errors import ConfigError


class GridNotOver(ConfigError):
    """best_lr's pair has grid runs still to run or finish: its seeds can run later, not never."""


RUN_NAME = re.compile(r"(?:lr(?P<lr>[0-9.eE+-]+)|best)-s(?P<seed>\d+)")


def run_name(name: str) -> tuple[float | None, int] | None:
    """A results sweep's run folder name: lr0.003-s0 -> (0.003, 0) (a grid run), best-s1 -> (None, 1) (a seeds run at
    the chosen lr); None for any other name."""
    m = RUN_NAME.fullmatch(name)
    return None if m is None else (float(m["lr"]) if m["lr"] else None, int(m["seed"]))


def lr_of(name: str) -> float:
    """The lr a grid run's folder names: lr0.003-s0 -> 0.003."""
    return run_name(name)[0]


def grid_of(sweep_dir: Path) -> set[float]:
    """The grid: every lr a seed-0 run folder of any pair names. The launcher starts a pair's grid runs one after
    another, so a pair the sweep reached holds a folder for each, finished or not."""
    return {lr_of(p.name) for p in Path(sweep_dir).glob("*-*/lr*-s0") if p.is_dir()}


def outcome(run: Path) -> dict | None:
    """A run folder's outcome: its task_eval.json (finished; it wins over an older nonfinite.json, e.g. resumed with
    train.nonfinite=skip), else {"status": "diverged", **nonfinite.json}, else None (not over: still to run, stopped,
    or failed; its job.log says which)."""
    if (run / "task_eval.json").is_file():
        return json.loads((run / "task_eval.json").read_text())
    if (run / "nonfinite.json").is_file():
        return {"status": "diverged", **json.loads((run / "nonfinite.json").read_text())}
    return None


def grid_runs(pair_dir: Path) -> tuple[dict[float, dict], list[Path]]:
    """{lr: outcome} of the pair's seed-0 grid runs that are over, and the grid folders with no outcome yet."""
    done, missing = {}, []
    for run in sorted(pair_dir.glob("lr*-s0")):
        rec = outcome(run)
        if rec is None:
            missing.append(run)
        elif rec.get("status") == "diverged":
            done[lr_of(run.name)] = rec
        else:
            done[float(rec["config"]["optim"]["lr"])] = rec
    return done, missing


def choose(done: dict[float, dict], metric: str = "val_acc") -> float | None:
    """The lr of the best run: the highest `metric`, then the lowest val_loss; runs with status "diverged" rank
    last, and None when every one did."""
    ok = {lr: r for lr, r in done.items() if r.get("status") != "diverged"}
    if not ok:
        return None
    return max(ok, key=lambda lr: rank(ok[lr], metric))


def rank(run: dict, metric: str = "val_acc") -> tuple[float, float]:
    """A run's place among a pair's runs, higher better: its `metric`, then the lower val_loss (ties on a saturated
    metric, e.g. 100% within the training length, are common)."""
    return run.get(metric) or 0.0, -(run.get("val_loss") or float("inf"))


def recorded_grid(runs: dict, pair: str) -> tuple[dict[float, dict], set[float]]:
    """From a results record's runs (docs/results/<task>.json): {lr: run} of the pair's seed-0 grid runs that are over
    (a run's entry holds the metric and val_loss `choose` reads; a diverged one's status), and every lr any grid run
    of the record names."""
    grid = {r["lr"] for r in runs.values() if r.get("stage") == "grid" and "lr" in r}
    done = {r["lr"]: r for key, r in runs.items() if key.split("/")[0] == pair and r.get("stage") == "grid"
            and r.get("status") in OVER}
    return done, grid


def best_lr(sweep_dir: str | Path, pair: str, metric: str = "val_acc", record: str | Path | None = None) -> float:
    """The pair's lr for its later seeds, from its grid runs' outcomes: the sweep folder's, and where `record` names
    a results record, the record's too (a folder's outcome wins), so the seeds run where the grid's folders are gone."""
    pair_dir = Path(sweep_dir) / pair
    done, missing = grid_runs(pair_dir)
    in_record, record_grid = recorded_grid(record_runs(record), pair)
    missing = [m for m in missing if lr_of(m.name) not in in_record]
    done = {**in_record, **done}
    absent = sorted((grid_of(Path(sweep_dir)) | record_grid) - set(done) - {lr_of(m.name) for m in missing})
    failed = [(m.name, line) for m in missing if (line := error_line(m / "job.log"))]
    if failed:  # e.g. a pair the model refuses: say why, not only that the grid is to be run
        raise ConfigError(f"best_lr: {pair} in {sweep_dir}: its grid run {failed[0][0]} has no task_eval.json, and "
                          f"its job.log says: {failed[0][1]}")
    if missing or absent or not done:
        what = f"{len(missing)} of its grid runs have no task_eval.json ({missing[0].name}, ...)" if missing else \
            "no grid run of it finished" if not done else \
            f"its grid lacks lr {', '.join(f'{x:g}' for x in absent)} (run by other pairs)"
        raise GridNotOver(f"best_lr: {pair} in {sweep_dir}: {what}; run (or finish) the grid sweep first, the same "
                          "command without _seeds")
    lr = choose(done, metric)
    if lr is None:
        raise ConfigError(f"best_lr: {pair} in {sweep_dir}: its run diverged at every lr of the grid "
                          f"({', '.join(f'{x:g}' for x in sorted(done))}; nonfinite.json in each); no lr to train "
                          "seeds at")
    return lr


def grid_not_over(cfg) -> str | None:
    """Why a job cannot run yet (hydra.launcher.ready): its lr is `${best_lr:METRIC}` and its pair's grid is not over,
    best_lr's own message; None for any other job, and for one best_lr refuses for good (a refused pair, a grid
    diverged at every lr: the job's own process says so)."""
    from omegaconf import OmegaConf

    lr = OmegaConf.to_container(cfg.optim, resolve=False).get("lr") if "optim" in cfg else None
    metric = re.fullmatch(r"\$\{best_lr:(\w+)\}", lr) if isinstance(lr, str) else None
    if metric is None:
        return None
    try:
        best_lr(str(cfg.hydra.sweep.dir), f"{cfg.backbone.name}-{cfg.pe.name}", metric[1],
                cfg.hydra.launcher.get("record"))
    except GridNotOver as e:
        return str(e)
    except Exception:  # e.g. ConfigError: the job's process fails with it, where the summary then shows it
        pass
    return None
