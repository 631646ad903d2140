"""The results page (docs/results/README.md): every backbone x scheme on each task, drawn from the sweeps' run folders.

    python scripts/results.py collect mqar outputs/results/mqar --device "NVIDIA H200" --software "torch 2.11, ..."
    python scripts/results.py plot mqar          # docs/results/mqar.png from docs/results/mqar.json
    python scripts/results.py compare mqar /tmp/rerun   # a sweep run again (same layout) against the record
    python scripts/results.py compare mqar /tmp/rerun --record --device ... --date ... --command ... --commit ...

`collect` reads each run folder of a `sweep=results_<task>` / `results_<task>_seeds` sweep (`<backbone>-<pe>/lr<lr>-s0`
for the grid, `<backbone>-<pe>/best-s<seed>` for the seeds) into the task's record, docs/results/<task>.json: the
scores of every finished run, the reason of every run that did not finish (a pair the model refuses, a fault), and the
learning rate each pair's later seeds train at (common/grid.py chooses it, as the seeds sweep did). Runs of another
session stay in the record; a run collected again replaces its entry. report.py draws the page's tables from the
records (blocks results_<task> and results_duality) and this file's `plot` the heatmaps. `compare --record` keeps a
rerun's comparison in docs/results/<task>_rerun.json, which the page's block results_rerun reads.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import re
import statistics
import sys
from pathlib import Path

from duality.common.grid import choose, outcome, run_name
from hydra_plugins.duality_launcher.gpus import NO_PLACE, error_line

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "docs" / "results"

BACKBONES = ["transformer", "fox", "path", "path_fox", "sympow", "linear_attn", "retnet", "mamba2", "gla", "deltanet",
             "gated_deltanet", "gated_oja"]
SCHEMES = ["nope", "rope", "selective_rope", "alibi", "t5", "vo_rope"]
# what each task's table shows: (label, how a run's task_eval.json gives it); accuracies in %
TASKS = {
    "mqar": {"title": "MQAR (128, 8)", "metric": "val_acc", "section": "mqar-128-8-scored-at-1-and-4-the-length",
             "what": "at (128, 8), scored at 128 and 512",
             "points": [("at 128 (trained)", lambda r: r["curve"]["128"]),
                        ("at 512 (4x)", lambda r: r["curve"]["512"])]},
    "s2": {"title": "S2 parity", "metric": "val_acc", "section": "s2-parity",
           "what": "seed 004's protocol for 2 epochs, scored to 512",
           "points": [("<= 128 (trained)", lambda r: r["val_acc"]), ("129-512", lambda r: r["val_acc_extrap"])]},
    "retrieval": {"title": "Retrieval (trained at 512)", "metric": "val_acc",
                  "section": "retrieval-trained-at-512-scored-to-32k", "what": "trained at 512, scored to 32k",
                  "points": [(f"at {n} ({x})", lambda r, n=n: r["curve"][str(n)])
                             for n, x in ((512, "trained"), (2048, "4x"), (8192, "16x"), (32768, "64x"))]},
}
# seed 000's dual pairs: (what the softmax side is, its cell), (the linear side, its cell)
DUAL_PAIRS = [("NoPE ↔ linear attention", ("transformer", "nope"), ("linear_attn", "nope")),
              ("ALiBi ↔ RetNet", ("transformer", "alibi"), ("retnet", "nope")),
              ("FoX ↔ Mamba2", ("fox", "nope"), ("mamba2", "nope")),
              ("FoX ↔ GLA", ("fox", "nope"), ("gla", "nope")),
              ("RoPE ↔ complex gate (linear attention + RoPE)", ("transformer", "rope"), ("linear_attn", "rope")),
              ("PaTH ↔ DeltaNet", ("path", "nope"), ("deltanet", "nope")),
              ("PaTH-FoX ↔ Gated DeltaNet", ("path_fox", "nope"), ("gated_deltanet", "nope")),
              # seed 001: both act on the values, a rotation (eq. 2) vs a gated Householder product (eq. 4); kin,
              # not exact duals (the exact dual of VO-RoPE, linear attention with rotated values, is not built)
              ("VO-RoPE ↔ gated Oja (value side)", ("transformer", "vo_rope"), ("gated_oja", "nope"))]


def record_path(task: str) -> Path:
    return RECORDS / f"{task}.json"


def load(task: str) -> dict | None:
    path = record_path(task)
    return json.loads(path.read_text()) if path.is_file() else None


def reason_of(log: Path) -> tuple[str, str]:
    """(status, reason) of a run folder without a result: the model's refusal, the job's own error line, or
    unfinished (no error: stopped at a deadline, or still to run)."""
    line = error_line(log)
    if line is None:
        return "unfinished", "stopped before the end (a deadline, or the lease ended) or not started"
    why = line.removeprefix("error: ")
    return ("refused" if "cannot use" in why else "failed"), why[:300]


def collect_runs(sweep: Path, task: str) -> dict:
    runs, gpu_s, wall_s = {}, gpu_seconds(sweep), completed_walls(sweep)
    for run in sorted(p for p in sweep.glob("*-*/*") if p.is_dir()):
        pair, name = run.parent.name, run.name
        backbone, _, pe = pair.partition("-")
        if backbone not in BACKBONES:  # not a run folder of this layout
            continue
        parsed = run_name(name)
        if parsed is None:
            continue
        lr, seed = parsed
        entry = {"backbone": backbone, "pe": pe, "seed": seed, "stage": "grid" if lr is not None else "seeds"}
        r = outcome(run)
        if r is None:
            entry["status"], entry["reason"] = reason_of(run / "job.log")
        elif r.get("status") == "diverged":  # train.nonfinite=stop ended it: an outcome (trainer/guard.py)
            entry.update(status="diverged", step=r["step"],
                         reason=f"step {r['step']:,}: loss {r['loss']:.4g}, gradient norm {r['grad_norm']:.4g}")
        else:
            entry.update(status="finished", lr=float(r["config"]["optim"]["lr"]), step=r["step"], tokens=r["tokens"],
                         val_loss=r["val_loss"], val_acc=r.get("val_acc"),
                         scores={label: get(r) for label, get in TASKS[task]["points"]})
            if "curve_family" in r:  # retrieval since 2026-11-29 evening: each family's share right at each length
                entry["families"] = r["curve_family"]
        if lr is not None and "lr" not in entry:
            entry["lr"] = lr
        if r is not None and f"{pair}/{name}" in gpu_s:  # what the status table's time left is estimated from
            entry["gpu_s"] = round(gpu_s[f"{pair}/{name}"], 1)
        if r is not None and f"{pair}/{name}" in wall_s:  # the launcher's expected length (hydra.launcher.finish_by)
            entry["wall_s"] = round(wall_s[f"{pair}/{name}"], 1)
        runs[f"{pair}/{name}"] = entry
    return runs


def gpu_seconds(sweep: Path) -> dict[str, float]:
    """Each run folder's cost in seconds of a whole GPU, from the launcher's log (launcher.jsonl): the wall time of
    its jobs (a paused run has several), each over the mean number of jobs on that GPU while it ran (8 side by side
    for 800 s: 100 s each; a job that failed in 10 s beside them hardly counts; a REFUSED one held no place),
    counting the jobs of the sweeps beside this one (the other tasks' folders, `<sweep>/../*/launcher.jsonl`: two
    sweeps sharing a GPU's places) on the same host's GPU (rows before 2026-11-30 name no host: their GPU index
    alone)."""
    spans: dict[tuple, list] = {}  # (host, gpu) -> [(start, end, run key or None for another sweep's job)]
    for log in [sweep / "launcher.jsonl", *(p for p in sweep.parent.glob("*/launcher.jsonl") if p.parent != sweep)]:
        for r, key in launcher_rows(log):
            if not r.get("wall_s") or r["status"] in NO_PLACE:
                continue
            key = key if log.parent == sweep else None
            spans.setdefault((r.get("host"), r["gpu"]), []).append((r["start"], r["start"] + r["wall_s"], key))
    cost: dict[str, float] = {}
    for jobs in spans.values():
        for a, b, key in jobs:
            if key is not None:
                together = sum(max(0.0, min(b, d) - max(a, c)) for c, d, _ in jobs)  # itself included
                cost[key] = cost.get(key, 0.0) + (b - a) ** 2 / together
    return cost


def run_key(overrides: dict) -> str | None:
    """The run folder a launcher.jsonl row's job writes, as the results sweeps' hydra.sweep.subdir names it
    (`<backbone>-<pe>/lr<lr>-s<seed>`, `.../best-s<seed>`); None for a job of another layout."""
    if not {"backbone", "pe"} <= set(overrides):
        return None
    seed = overrides.get("seed", "0")
    name = f"lr{float(overrides['optim.lr'])}-s{seed}" if "optim.lr" in overrides else f"best-s{seed}"
    return f"{overrides['backbone']}-{overrides['pe']}/{name}"


def launcher_rows(log: Path):
    """A launcher.jsonl's rows, each with the run folder its job writes (run_key; None for another layout)."""
    for line in log.read_text().splitlines() if log.exists() else []:
        r = json.loads(line)
        yield r, run_key(dict(x.split("=", 1) for x in r["overrides"] if "=" in x))


def completed_walls(sweep: Path) -> dict[str, float]:
    """Each run's wall time in its sweep's launcher.jsonl: that of the job that completed it (a paused run's last)."""
    return {key: r["wall_s"] for r, key in launcher_rows(sweep / "launcher.jsonl")
            if r["status"] == "COMPLETED" and key}


def grid_lrs(runs: dict) -> set[float]:
    """The grid: every lr a seed-0 grid run of any pair names (common/grid.grid_of, on the record)."""
    return {r["lr"] for r in runs.values() if r["stage"] == "grid" and "lr" in r}


def chosen_lrs(runs: dict, metric: str) -> dict:
    """Each pair's learning rate for seeds 1 and 2: common/grid.py's choice over its seed-0 grid runs, once every lr
    of the grid (each lr any pair's grid run names) has finished or diverged for it (none where all diverged)."""
    grid = grid_lrs(runs)
    grids: dict[str, dict] = {}
    for key, r in runs.items():
        if r["stage"] == "grid" and r["status"] in ("finished", "diverged"):
            grids.setdefault(key.split("/")[0], {})[r["lr"]] = r
    chosen = {pair: choose(done, metric) for pair, done in sorted(grids.items()) if set(done) == grid}
    return {pair: lr for pair, lr in chosen.items() if lr is not None}


def collect(task: str, sweep: Path, meta: dict) -> dict:
    rec = load(task) or {"task": task, "title": TASKS[task]["title"], "sessions": [], "runs": {}}
    new = collect_runs(sweep, task)
    if not new:
        raise SystemExit(f"{sweep}: no run folders (<backbone>-<pe>/lr<lr>-s<seed> or best-s<seed>) found")
    before = {k for k, r in rec["runs"].items() if r["status"] == "finished"}  # a sweep folder kept over sessions
    rec["runs"].update(new)
    rec["runs"] = dict(sorted(rec["runs"].items()))
    rec["chosen_lr"] = chosen_lrs(rec["runs"], TASKS[task]["metric"])
    # the session's pairs: those with a run it finished, and those refused (a folder kept over sessions holds
    # earlier sessions' pairs too, which "N runs finished over M pairs" is not about)
    ran = {k.split("/")[0] for k, r in new.items() if r["status"] == "finished" and k not in before}
    refused = {k.split("/")[0] for k, r in new.items() if r["status"] == "refused"}
    rec["sessions"].append({**meta, "finished": sum(r["status"] == "finished" and k not in before
                                                    for k, r in new.items()),
                            "pairs": len(ran) + len(refused), "refused": len(refused)})
    record_path(task).parent.mkdir(parents=True, exist_ok=True)
    record_path(task).write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def cell_runs(rec: dict, backbone: str, pe: str) -> list[dict]:
    """The runs a cell reports: seed 0 of the grid at the chosen lr, and the seeds sweep's runs."""
    pair = f"{backbone}-{pe}"
    lr = rec.get("chosen_lr", {}).get(pair)
    return [r for k, r in rec["runs"].items() if k.startswith(pair + "/") and r["status"] == "finished"
            and (r["stage"] == "seeds" or r["lr"] == lr)]


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample sd (0 for one seed: the cell then says how many seeds it has)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def cell_mean(rec: dict, backbone: str, pe: str, label: str) -> float | None:
    """A cell's mean score at a reported point, in %; None where the cell has no finished run."""
    runs = cell_runs(rec, backbone, pe)
    return mean_sd([100 * r["scores"][label] for r in runs])[0] if runs else None


def short_reason(rec: dict, backbone: str, pe: str) -> str:
    """Why a cell has no number, in a few words (the whole reason is in the record)."""
    pair = f"{backbone}-{pe}"
    others = [r for k, r in rec["runs"].items() if k.startswith(pair + "/")]
    if not others:  # a refusal is the model's (a scheme the backbone cannot use), the same on every task
        others = [r for task in TASKS if (other := load(task)) for k, r in other["runs"].items()
                  if k.startswith(pair + "/") and r["status"] == "refused"][:1]
        if not others:
            return "not run"
    grid = grid_lrs(rec["runs"])
    if grid and {r["lr"] for r in others if r["stage"] == "grid" and r["status"] == "diverged"} == grid:
        return "diverged at every lr"
    for status in ("refused", "failed", "unfinished"):
        hit = next((r for r in others if r["status"] == status), None)
        if hit:
            if status == "refused":
                kind = re.search(r"is an? (\S+) scheme", hit["reason"])
                return f"refused: {kind[1] if kind else 'this'} scheme"
            return "failed (see record)" if status == "failed" else "not finished"
    return "grid not finished" if any(r["stage"] == "grid" for r in others) else "not run"


def cell(rec: dict, backbone: str, pe: str, label: str) -> str:
    runs = cell_runs(rec, backbone, pe)
    if not runs:
        return short_reason(rec, backbone, pe)
    m, sd = mean_sd([100 * r["scores"][label] for r in runs])
    diverged = sum(k.startswith(f"{backbone}-{pe}/") and r["stage"] == "seeds" and r["status"] == "diverged"
                   for k, r in rec["runs"].items())
    also = f", {diverged} diverged" if diverged else ""
    if len(runs) == 1:
        return f"{m:.1f} (1 seed{also})"
    return f"{m:.1f} ± {sd:.1f}" + ("" if len(runs) == 3 else f" ({len(runs)} seeds{also})")


def planned(task: str) -> tuple[list[str], list[str]]:
    """The backbones and schemes the task's sweep runs (conf/sweep/results_<task>_seeds.yaml): the table's rows and
    columns, so a pair not reached yet is a cell that says so."""
    from omegaconf import OmegaConf
    params = OmegaConf.load(ROOT / "conf" / "sweep" / f"results_{task}_seeds.yaml").hydra.sweeper.params
    backbones, schemes = str(params.backbone).split(","), str(params.pe).split(",")
    return [b for b in BACKBONES if b in backbones], [s for s in SCHEMES if s in schemes]


def planned_grid(task: str) -> list[float]:
    """The grid's learning rates (conf/sweep/results_<task>.yaml)."""
    from omegaconf import OmegaConf
    lrs = OmegaConf.load(ROOT / "conf" / "sweep" / f"results_{task}.yaml").hydra.sweeper.params["optim.lr"]
    return sorted(float(x) for x in str(lrs).split(","))


def run_costs(task: str) -> dict[str, float]:
    """Each backbone's mean cost of a run (GPU-seconds, `gpu_s`) on the task; a backbone with none yet there: its
    mean on another task's record, scaled by the two tasks' median ratio over the backbones both have."""
    def means(t):
        per: dict[str, list] = {}
        for r in (load(t) or {"runs": {}})["runs"].values():
            if "gpu_s" in r:
                per.setdefault(r["backbone"], []).append(r["gpu_s"])
        return {b: statistics.fmean(v) for b, v in per.items()}
    mean = means(task)
    for other in (t for t in TASKS if t != task):
        there = means(other)
        if shared := [b for b in mean if b in there]:
            scale = statistics.median(mean[b] / there[b] for b in shared)
            mean |= {b: scale * c for b, c in there.items() if b not in mean}
    return mean


def accepted_pairs(task: str) -> list[str]:
    """The task's planned pairs the model builds (`<backbone>-<pe>`); the others it refuses."""
    from duality.model import valid_schemes
    backbones, schemes = planned(task)
    return [f"{b}-{s}" for b in backbones for s in schemes if s in valid_schemes(b)]


def whole_cells(task: str, rec: dict) -> int:
    """How many of the task's accepted pairs have all 3 seeds in the record."""
    return sum(len(cell_runs(rec, *p.split("-", 1))) == 3 for p in accepted_pairs(task))


def progress(task: str) -> dict:
    """How far the task's sweeps are, from its record: grid and seeds runs over (finished, or diverged: outcomes),
    the cells with all 3 seeds, and the GPU-hours the rest would take at each backbone's mean cost a run so far
    (run_costs; a backbone with none anywhere: the slowest backbone's)."""
    rec = load(task) or {"runs": {}, "chosen_lr": {}}
    (backbones, schemes), grid = planned(task), planned_grid(task)
    pairs = accepted_pairs(task)
    over = {k: r for k, r in rec["runs"].items()
            if k.split("/")[0] in pairs and r["status"] in ("finished", "diverged")}
    grid_over = {(k.split("/")[0], r["lr"]) for k, r in over.items() if r["stage"] == "grid"}
    seeds_over = [k for k, r in over.items() if r["stage"] == "seeds"]
    dead = {p for p in pairs if all((p, lr) in grid_over for lr in grid) and p not in rec["chosen_lr"]}
    mean = run_costs(task)
    left = {p: sum((p, lr) not in grid_over for lr in grid)
            + (0 if p in dead else 2 - sum(k.startswith(p + "/") for k in seeds_over)) for p in pairs}
    slowest = max(mean.values(), default=0.0)
    return {"backbones": len(backbones), "schemes": len(schemes),
            "pairs": len(pairs), "refused": len(backbones) * len(schemes) - len(pairs),
            "grid": len(grid_over), "grid_of": len(pairs) * len(grid),
            "diverged": sum(r["status"] == "diverged" for r in over.values()),
            "seeds": len(seeds_over), "seeds_of": 2 * (len(pairs) - len(dead)), "dead": len(dead),
            "whole": whole_cells(task, rec),
            "runs_left": sum(left.values()),
            "hours_left": sum(n * mean.get(p.split("-")[0], slowest) for p, n in left.items()) / 3600}


# a task the page plans but has not run: why
NOT_RUN = {"Copying": "**not run**: the issue asks for it if time remains; seed 004's protocol is 536M tokens a run at "
                      "width 512, several times a retrieval run"}


def status_table() -> str:
    """The page's first table: each task's runs over and the time its sweeps still need, from the records."""
    last = max((x["date"] for t in TASKS if (rec := load(t)) for x in rec["sessions"]), default="no record yet")
    out = [f"| task | pairs | grid runs over (seed 0) | seeds runs over | cells with 3 seeds | state ({last}) |",
           "|---|---|---:|---:|---:|---|"]
    for task, t in TASKS.items():
        p = progress(task)
        div = f" ({p['diverged']} diverged)" if p["diverged"] else ""
        n, h = p["runs_left"], p["hours_left"]
        cost = f"{h:.1f} hours" if h >= 1 else f"{max(1, round(60 * h))} minutes"
        state = ("**done**" if not n else f"**under way**: {n} run{'s' * (n != 1)} left, about {cost} of one H200 "
                 "(each backbone's mean cost a run so far)")
        out.append(f"| [{t['title'].split(' (')[0]}](#{t['section']}), {t['what']} | {p['backbones']} backbones × "
                   f"{p['schemes']} schemes: {p['pairs']} accepted, {p['refused']} refused by the model | "
                   f"{p['grid']} of {p['grid_of']}{div} | {p['seeds']} of {p['seeds_of']} | {p['whole']} of "
                   f"{p['pairs']} | {state} |")
    out += [f"| {name} | — | — | — | — | {why} |" for name, why in NOT_RUN.items()]
    return "\n".join(out)


def table(task: str) -> str:
    """A table per reported point: backbone rows x scheme columns, mean ± sd over seeds (%)."""
    rec = load(task)
    if rec is None:
        return f"(no record yet: {record_path(task).relative_to(ROOT)})"
    backbones, schemes = planned(task)
    out = []
    for label, _ in TASKS[task]["points"]:
        out += [f"**{rec['title']}, accuracy {label}**, %, mean ± sd over seeds 0-2", "",
                "| backbone | " + " | ".join(schemes) + " |", "|---|" + "---:|" * len(schemes)]
        out += [f"| {b} | " + " | ".join(cell(rec, b, s, label) for s in schemes) + " |" for b in backbones]
        out.append("")
    out += family_table(rec, backbones, schemes)
    lrs = rec.get("chosen_lr", {})
    grid = sorted(grid_lrs(rec["runs"]))
    out += [f"Learning rate of each cell (the best of {', '.join(f'{x:g}' for x in grid)} on seed 0, by accuracy at "
            "the training length):", "", "| backbone | " + " | ".join(schemes) + " |", "|---|" + "---:|" * len(schemes)]
    out += [f"| {b} | " + " | ".join(f"{lrs[f'{b}-{s}']:g}" if f"{b}-{s}" in lrs else "—" for s in schemes) + " |"
            for b in backbones]
    diverged = [f"{k.split('/')[0]} at {r['lr']:g} ({r['reason']})" for k, r in rec["runs"].items()
                if r["status"] == "diverged" and r["stage"] == "grid"]
    if diverged:
        out += ["", "Diverged grid runs (`train.nonfinite=stop` ended them; each counts as its pair's worst lr): "
                + "; ".join(diverged) + "."]
    s = rec["sessions"]
    first, last = min(x["date"] for x in s), max(x["date"] for x in s)
    out += ["", f"Runs: {len(s)} session{'s' * (len(s) > 1)} ({first if first == last else f'{first} to {last}'}) "
            f"on {', '.join(dict.fromkeys(x['device'] for x in s))}, {sum(x['finished'] for x in s)} runs finished; "
            f"each session's command, code and software: [how it runs](how_it_runs.md#{anchor(rec['title'])}). "
            f"Record: docs/results/{task}.json (every run's scores, and the reason of each that did not finish)."]
    return "\n".join(out)


def sessions_table(task: str) -> str:
    """Each session that ran the task's sweeps, a row of what `collect` recorded: the device, the runs it finished,
    the pairs it ran and those the model refused, the command as run, the code and the software."""
    rec = load(task)
    if rec is None:
        return f"(no record yet: {record_path(task).relative_to(ROOT)})"
    out = [f"### {rec['title']}", "", "| date | device | runs finished | pairs run, refused | command | code | "
           "software |", "|---|---|---:|---:|---|---|---|"]

    def text(s):  # a | in a command is not a column's end, nor `<lease end - now>` an HTML tag
        return s.replace("|", "\\|").replace("<", "&lt;")
    out += [f"| {x['date']} | {x['device']} | {x['finished']} | {x['pairs'] - x['refused']}, {x['refused']} | "
            f"{text(x['command'])} | {x['commit']} | {x['software']} |" for x in rec["sessions"]]
    return "\n".join(out)


def anchor(heading: str) -> str:
    """A Markdown heading's link anchor, as GitHub makes it: `S2 parity` -> `s2-parity`."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def family_table(rec: dict, backbones: list[str], schemes: list[str]) -> list[str]:
    """Retrieval's families apart (task_eval.json's curve_family), at the first two lengths: a row per pair whose
    cell's runs recorded them (runs before 2026-11-29's evening did not), the mean over those runs."""
    runs = {(b, p): [r for r in cell_runs(rec, b, p) if "families" in r] for b in backbones for p in schemes}
    runs = {pair: rs for pair, rs in runs.items() if rs}
    if not runs:
        return []
    families = list(next(iter(runs.values()))[0]["families"])
    lengths = sorted({int(n) for rs in runs.values() for r in rs for f in families for n in r["families"][f]})[:2]

    def share(rs, f, n):
        vals = [r["families"][f][str(n)] for r in rs if str(n) in r["families"][f]]
        return f"{100 * statistics.fmean(vals):.0f}" if vals else "—"
    out = [f"**{rec['title']} by family**, % right at {' / '.join(map(str, lengths))} tokens, mean over the cell's "
           "runs that recorded it (runs), at the cell's lr", "",
           "| pair | runs | " + " | ".join(families) + " |", "|---|---:|" + "---:|" * len(families)]
    out += [f"| {b} + {p} | {len(rs)} | " + " | ".join(" / ".join(share(rs, f, n) for n in lengths) for f in families)
            + " |" for (b, p), rs in runs.items()]
    return out + [""]


STRONG = ["transformer", "fox", "path", "path_fox", "sympow", "deltanet", "gated_deltanet", "gated_oja"]
GATED = ["gla", "mamba2", "retnet"]  # scalar / diagonal decays: the weakest recall here


def span(values) -> str:
    """The README lines' range of numbers (None left out), to one decimal: `61.6–77.9`, or one number where both ends
    round alike."""
    values = [v for v in values if v is not None]
    lo, hi = (f"{x:.1f}".replace("-0.0", "0.0") for x in (min(values), max(values)))  # -0.0: a gain under 0.05
    return lo if lo == hi else f"{lo}–{hi}"


def mqar_summary() -> str:
    """The README's bullet on MQAR, computed from its record."""
    rec = load("mqar")
    if rec is None:
        return "(no MQAR record yet)"
    (at, _), (beyond, _) = TASKS["mqar"]["points"]

    mean = functools.partial(cell_mean, rec)

    def drop(group, p):
        return span([mean(b, p, at) - mean(b, p, beyond) for b in group if mean(b, p, at) is not None])

    low = min(mean(b, p, at) for b in STRONG for p in ("nope", "rope", "selective_rope"))
    nope, srope = span(mean(b, "nope", at) for b in GATED), span(mean(b, "selective_rope", at) for b in GATED)
    return (f"**MQAR** ({seeds_done('mqar', rec)}): the softmax mixers and the delta-rule / Oja recurrences recall "
            f"≥ {low:.1f}% at the training length with NoPE, RoPE or Selective RoPE; GLA, Mamba2 and RetNet reach "
            f"{nope}% with NoPE and {srope}% with Selective RoPE. At 4× the length RoPE loses "
            f"{drop(STRONG, 'rope')} points on the first group and {drop(GATED, 'rope')} on the second, Selective RoPE "
            f"{drop(STRONG, 'selective_rope')} and {drop(GATED, 'selective_rope')}.")


def seeds_done(task: str, rec: dict) -> str:
    """`39 pairs × 3 seeds`, or `38 of 39 pairs with three seeds so far` while cells lack seeds."""
    done, pairs = whole_cells(task, rec), len(accepted_pairs(task))
    return f"{done} pairs × 3 seeds" if done == pairs else f"{done} of {pairs} pairs with three seeds so far"


def s2_summary() -> str:
    """The README's bullet on S2, from the record's cells with three seeds: PaTH's and PaTH-FoX's, and the rest's
    (at chance or not, with which scheme, and past the training length)."""
    rec = load("s2")
    if rec is None:
        return "(no S2 record yet)"
    (at, _), (beyond, _) = TASKS["s2"]["points"]
    cells = {(b, p): runs for b in BACKBONES for p in SCHEMES if len(runs := cell_runs(rec, b, p)) == 3}

    def pct(runs, label):
        return [100 * r["scores"][label] for r in runs]

    path = {k: runs for k, runs in cells.items() if k[0] in ("path", "path_fox")}
    rest = {k: mean_sd(pct(runs, at))[0] for k, runs in cells.items() if k not in path}
    learned = sorted(((m, k) for k, m in rest.items() if m >= 60), reverse=True)
    out = f"**S2 parity** ({seeds_done('s2', rec)}): "
    if path:
        out += (f"PaTH and PaTH-FoX reach {span(v for runs in path.values() for v in pct(runs, at))}% within the "
                f"training length in every run and {span(mean_sd(pct(runs, beyond))[0] for runs in path.values())}% "
                f"past it (cell means); ")
    low, high = len(rest) - len(learned), len(learned)
    out += f"of the other {len(rest)} cells {low} stay{'s' * (low == 1)} at chance within it (under 60%)"
    if learned:
        (m, (b, p)), srope = learned[0], sum(k[1] == "selective_rope" for _, k in learned)
        past = max(mean_sd(pct(cells[k], beyond))[0] for _, k in learned)
        out += (f" and {high} rise{'s' * (high == 1)} above it, {srope} of them with Selective RoPE (best: {b} + {p} "
                f"{m:.1f}%), none above {past:.1f}% past it")
    return out + "."


def retrieval_summary() -> str:
    """The README's bullet on retrieval, from its record: the cells that hold past 16× the training length (over
    40%), RoPE's cells there, and the decaying recurrences at the training length."""
    rec = load("retrieval")
    if rec is None:
        return "(no retrieval record yet)"
    (at, _), _, (far, _), _ = TASKS["retrieval"]["points"]
    at_train, mean = ({(b, p): m for b in BACKBONES for p in SCHEMES if (m := cell_mean(rec, b, p, label)) is not None}
                      for label in (at, far))
    held = sorted(((m, k) for k, m in mean.items() if m > 40), reverse=True)
    names = ", ".join(f"{b} + {p} {m:.1f}%" for m, (b, p) in held) or "none"
    rope = [m for (b, p), m in mean.items() if p == "rope"]
    decaying = [m for (b, p), m in at_train.items() if b in GATED]
    out = (f"**Retrieval** ({seeds_done('retrieval', rec)}, trained at 512): at 16× the length (8k) the cells over "
           f"40% are {names}; with RoPE every cell is at ≤ {max(rope):.1f}%")
    if decaying:
        out += f"; RetNet, Mamba2 and GLA learn nothing at this budget (≤ {max(decaying):.1f}% at 512)"
    return out + "."


def negeig_runs() -> dict[tuple[str, str], dict]:
    """sweep=s2_negeig (DeltaNet and Gated DeltaNet with PaTH's range of beta, seed 0): (backbone, pe) -> the S2
    scores of the pair's best lr, from its table (scripts/collect_sweep.py's results.csv); {} before it has run."""
    path = RECORDS / "s2_negeig" / "results.csv"
    if not path.is_file():
        return {}
    return {tuple(r["model"].split(" + ")): {k: float(r[k]) for k in ("val_acc", "val_acc_extrap")}
            for r in csv.DictReader(path.read_text().splitlines())}


def negeig_summary() -> str:
    """The README's sentence on sweep=s2_negeig; none before that sweep has run."""
    runs = negeig_runs().values()
    if not runs:
        return ""
    within, past = (span(100 * r[col] for r in runs) for col in ("val_acc", "val_acc_extrap"))
    return (f" With PaTH's range of β, (0, 2), DeltaNet and Gated DeltaNet reach {within}% within the training length "
            f"and {past}% past it ({len(runs)} pairs: `sweep=s2_negeig`, seed 0, each pair at its best lr).")


def duality_table() -> str:
    """Each dual pair's two cells side by side, on every task with a record, at the training length and the first
    length beyond it (the task's own table has the rest)."""
    recs = {t: load(t) for t in TASKS}
    recs = {t: r for t, r in recs.items() if r}
    head = [f"{recs[t]['title']} {label}" for t in recs for label, _ in TASKS[t]["points"][:2]]
    out = ["| dual pair | softmax side | linear side | " + " | ".join(head) + " |",
           "|---|---|---|" + "---|" * len(head)]
    negeig = negeig_runs()
    for name, (b1, p1), (b2, p2) in DUAL_PAIRS:
        vals = [f"{cell(r, b1, p1, label)} vs {cell(r, b2, p2, label)}" for t, r in recs.items()
                for label, _ in TASKS[t]["points"][:2]]
        out.append(f"| {name} | {b1} + {p1} | {b2} + {p2} | " + " | ".join(vals) + " |")
        if (b2, p2) in negeig:  # the like-for-like dual: the delta rule with PaTH's beta range (S2 alone, seed 0)
            vals = [f"{cell(r, b1, p1, label)} vs {100 * get(negeig[b2, p2]):.1f} (1 seed)" if t == "s2" else
                    "not run" for t, r in recs.items() for label, get in TASKS[t]["points"][:2]]
            out.append(f"| {name}, β in (0, 2) | {b1} + {p1} | {b2} + {p2}, allow_neg_eigval | " + " | ".join(vals)
                       + " |")
    return "\n".join(out)


def plot(task: str, out: Path | None = None) -> Path:
    """A heatmap a reported point: backbone rows x scheme columns, the mean over seeds; a cell without a number is
    grey and says why."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rec = load(task)
    (backbones, schemes), points = planned(task), TASKS[task]["points"]
    fig, axes = plt.subplots(1, len(points), figsize=(4.2 * len(points) + 1.5, 7), squeeze=False, sharey=True)
    for k, (ax, (label, _)) in enumerate(zip(axes[0], points)):
        grid = np.full((len(backbones), len(schemes)), np.nan)
        for i, b in enumerate(backbones):
            for j, s in enumerate(schemes):
                m = cell_mean(rec, b, s, label)
                if m is not None:
                    grid[i, j] = m
                    ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=8,
                            color="white" if grid[i, j] < 50 else "black")
                else:
                    ax.add_patch(plt.Rectangle((j - .5, i - .5), 1, 1, color="0.85"))
                    ax.text(j, i, short_reason(rec, b, s).split(":")[0], ha="center", va="center", fontsize=6)
        im = ax.imshow(grid, vmin=0, vmax=100, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(schemes)), schemes, rotation=40, ha="right", fontsize=8)
        ax.set_yticks(range(len(backbones)), backbones, fontsize=8)
        ax.tick_params(labelleft=k == 0)
        ax.set_title(f"accuracy {label}, %", fontsize=9)
    fig.suptitle(f"{rec['title']}: mean over the seeds run (3 a finished cell) at each cell's learning rate\n"
                 f"(docs/results/{task}.json)", fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.6)
    out = out or RECORDS / f"{task}.png"
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def compare(task: str, sweep: Path) -> list[dict]:
    """A rerun's finished runs (the same folder layout, e.g. a sweep command run again from a clean checkout) against
    the record's runs of the same name: a row per run and reported point, in % (the difference: rerun - record), with
    the run's validation losses (the record's, the rerun's)."""
    rec = load(task)
    if rec is None:
        raise SystemExit(f"no record {record_path(task)} to compare with")
    rows = []
    for key, r in collect_runs(sweep, task).items():
        old = rec["runs"].get(key)
        if r["status"] != "finished" or old is None or old["status"] != "finished":
            continue
        for label in r["scores"]:
            a, b = 100 * old["scores"][label], 100 * r["scores"][label]
            rows.append({"run": key, "point": label, "record": a, "rerun": b, "diff": b - a,
                         "val_loss": [old["val_loss"], r["val_loss"]]})
    return rows


def spread(rows: list[dict]) -> tuple[dict, float]:
    """Of compare's rows: the row of the largest |difference|, and the mean |difference| (points)."""
    return max(rows, key=lambda x: abs(x["diff"])), statistics.fmean(abs(x["diff"]) for x in rows)


def rerun_path(task: str) -> Path:
    return RECORDS / f"{task}_rerun.json"


def rerun_summary() -> str:
    """The page's rerun check: a line per task whose sweep was run again and compared (`compare --record`)."""
    lines = []
    for task in TASKS:
        if not rerun_path(task).is_file():
            continue
        r = json.loads(rerun_path(task).read_text())
        rows = r["rows"]
        runs = sorted({x["run"] for x in rows})
        pairs = sorted({x.split("/")[0] for x in runs})
        worst, mean = spread(rows)
        gaps = {x["run"]: abs(x["val_loss"][1] - x["val_loss"][0]) for x in rows}
        recorded = sorted({s["commit"] for s in load(task)["sessions"]})
        lines.append(
            f"- {TASKS[task]['title']}, {r['date']}, {r['device']}, a clean checkout of {r['commit']}: "
            f"`{r['command']}`, {len(runs)} runs ({len(pairs)} pairs: {', '.join(pairs)}) against the record's "
            f"(code {', '.join(recorded)}): largest difference {worst['diff']:+.1f} points ({worst['run']}, "
            f"{worst['point']}), mean |difference| {mean:.2f}; "
            f"validation loss bit for bit equal in {sum(g == 0 for g in gaps.values())} of {len(runs)} runs, "
            f"the largest gap {max(gaps.values()):.1g}.")
    return "\n".join(lines) or "- Not run yet."


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="a sweep folder's runs into docs/results/<task>.json")
    c.add_argument("task", choices=list(TASKS))
    c.add_argument("sweep", type=Path)
    for flag in ("--device", "--date", "--software", "--command", "--commit"):  # where, when, how, what, which code
        c.add_argument(flag, required=True, help="the sweep commands as run" if flag == "--command" else None)
    p = sub.add_parser("plot", help="docs/results/<task>.png from its record")
    p.add_argument("task", choices=list(TASKS))
    p.add_argument("--out", type=Path)
    k = sub.add_parser("compare", help="a rerun's runs against the record's runs of the same name")
    k.add_argument("task", choices=list(TASKS))
    k.add_argument("sweep", type=Path)
    k.add_argument("--json", type=Path, help="also write the rows here")
    k.add_argument("--record", action="store_true", help="keep the comparison in docs/results/<task>_rerun.json "
                   "(the page's rerun check), with --device, --date, --command (as run) and --commit (the checkout's)")
    for flag in ("--device", "--date", "--command", "--commit"):
        k.add_argument(flag)
    a = ap.parse_args(argv)
    if a.cmd == "compare":
        meta = {f: getattr(a, f) for f in ("date", "device", "command", "commit")}
        if a.record and None in meta.values():
            raise SystemExit("compare --record needs " + ", ".join(f"--{f}" for f, v in meta.items() if v is None))
        rows = compare(a.task, a.sweep)
        if not rows:
            raise SystemExit(f"{a.sweep}: no finished run that the record also has")
        for x in rows:
            print(f"{x['run']:40s} {x['point']:18s} record {x['record']:6.1f}  rerun {x['rerun']:6.1f}  "
                  f"{x['diff']:+6.1f}")
        worst, mean = spread(rows)
        n = len({x["run"] for x in rows})
        print(f"{n} run{'s' * (n != 1)} compared; largest difference {worst['diff']:+.1f} points "
              f"({worst['run']}, {worst['point']}); mean |difference| {mean:.2f}")
        if a.json:
            a.json.write_text(json.dumps(rows, indent=1) + "\n")
        if a.record:
            rerun_path(a.task).write_text(json.dumps({"task": a.task, **meta, "rows": rows}, indent=1) + "\n")
            print(f"wrote {rerun_path(a.task)}")
    elif a.cmd == "collect":
        rec = collect(a.task, a.sweep, {"date": a.date, "device": a.device, "software": a.software,
                                        "command": a.command, "commit": a.commit})
        print(f"{record_path(a.task)}: {len(rec['runs'])} runs, {len(rec['chosen_lr'])} pairs with a chosen lr")
    else:
        print(plot(a.task, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
