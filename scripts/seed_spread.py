"""How far one seed's result can be trusted: the spread over seeds of recorded synthetic-task runs, and the gap
between schemes seed by seed.

    python scripts/seed_spread.py docs/synthetic/mqar_d64_h100_2026-11-25.json \
        docs/synthetic/mqar_d64_seeds_h100_2026-11-25.json --setting mqar256x16 --baseline nope \
        --out docs/synthetic/mqar_d64_seeds_h100.png
    python scripts/seed_spread.py outputs/synthetic/mqar --baseline nope     # straight after synthetic_gpu.sh
    python scripts/seed_spread.py outputs/synthetic/mqar --record docs/synthetic/NEW.json --note "what, where, how"
    python scripts/seed_spread.py docs/synthetic/s2_seedlike_h100_2026-11-25.json --metric val_acc_extrap \
        --curves docs/synthetic/s2_seedlike_h100.png       # each seed's training and accuracy against length
    python scripts/seed_spread.py docs/synthetic/copying_*full*.json docs/synthetic/copying_seeds*.json \
        --final docs/synthetic/copying_seeds_h100.png       # finished runs' final curves: mean over seeds by length

Reads run records (JSON: {"runs": {name: {"evaluations": [{"step", "val_acc", ...}, ...]}}}, docs/synthetic) or
run folders (synthetic_gpu.sh's RUNS/<what>: each job's metrics.jsonl), named as synthetic_gpu.sh names its jobs:
`<setting>-<model ...>-s<seed>[-lr<lr>]` (e.g. mqar256x16-d64-gla-selective_rope-s3-lr4.6e-3). A run scores its
best evaluation of --metric (Zoology's MQAR score); later files win for a run named twice. Prints one table per
setting: each model and learning rate (and, with --best-over, "best lr": each seed's best over those learning rates)
with the mean, the sample standard deviation and every seed's score; then, with --baseline (a model suffix such as
nope), each model's difference from the baseline seed by seed (the seeds both ran): the mean difference, its
standard error and how many seeds favour the model; with several settings, also pooled over all their (setting, seed)
pairs. --out draws the scores (one dot a seed, a bar at the mean) per setting and learning rate. --record writes run
folders as such a record (every evaluation of every run, whether it finished, its logged memory peak) with --note,
--device and --software: the form docs/synthetic keeps. --final tabulates and draws the final curves of finished runs
(task_eval.json's `curve`, `curve_char`, ...: the trained model, not its best evaluation) against length.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import time
from collections import defaultdict
from pathlib import Path

NAME = re.compile(r"^(?P<setting>[^-]+)-(?P<model>.+?)-s(?P<seed>\d+)(?:-lr(?P<lr>.+))?$")


def load(paths, metric: str = "val_acc", max_step: int | None = None) -> dict:
    """{(setting, model, lr): {seed: best metric}} from run-record files; lr is "task" for the task's default."""
    scores: dict = defaultdict(dict)
    for key, seed, run in named_runs(paths, max_step):
        values = [e[metric] for e in run["evaluations"] if e.get(metric) is not None]
        if values:
            scores[key][seed] = max(values)
    return dict(scores)


def named_runs(paths, max_step: int | None = None):
    """(setting, model, lr), seed, run for every run of run-record files or run folders, in order (a later file's run
    of the same name comes later); with max_step, a run's evaluations after that step are left out (runs of different
    lengths compared at one budget)."""
    for path in map(Path, paths):
        if path.is_dir():  # synthetic_gpu.sh's RUNS/<what>: one folder a job, its evaluations in metrics.jsonl
            runs = folder_runs(path)
        else:
            runs = json.loads(path.read_text())["runs"]
        for name, run in runs.items():
            m = NAME.match(name)
            if m is None:
                raise SystemExit(f"{path}: run {name!r} is not named <setting>-<model>-s<seed>[-lr<lr>] "
                                 "(scripts/synthetic_gpu.sh's job names)")
            if max_step is not None:
                run = {**run, "evaluations": [e for e in run["evaluations"] if e["step"] <= max_step]}
            yield (m["setting"], m["model"], m["lr"] or "task"), int(m["seed"]), run


def folder_runs(folder: Path) -> dict:
    """{name: run} of synthetic_gpu.sh's run folders under `folder`: each run's evaluation rows of metrics.jsonl,
    whether it finished (its task_eval.json exists; then also its final curves, e.g. copying's letters right by
    length, `curve_char`), and the largest peak memory it logged."""
    runs = {}
    for d in sorted(folder.iterdir()):
        if not (d / "metrics.jsonl").exists():
            continue
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
        peaks = [r["peak_mem_gib"] for r in rows if r.get("peak_mem_gib") is not None]
        final = json.loads((d / "task_eval.json").read_text()) if (d / "task_eval.json").exists() else None
        runs[d.name] = {"finished": final is not None,
                        **{k: v for k, v in (final or {}).items() if k.startswith("curve")},
                        "evaluations": [r for r in rows if any(k.startswith("val_") for k in r)],
                        "train_peak_mem_gib": max(peaks) if peaks else None,
                        "tokens_per_step": next((r["tokens"] // r["step"] for r in rows if r.get("tokens")
                                                 and r.get("step")), None)}
    return runs


def record(folders, note: str, device: str, software: str) -> dict:
    """A run record (docs/synthetic's form) of synthetic_gpu.sh's run folders (folder_runs)."""
    runs = {name: run for folder in map(Path, folders) for name, run in folder_runs(folder).items()}
    if not runs:
        raise SystemExit(f"no run folder (one with a metrics.jsonl) in {', '.join(map(str, folders))}")
    return {"device": device, "date": time.strftime("%Y-%m-%d"), "software": software, "note": note, "runs": runs}


def with_best_lr(scores: dict, grid: list[str]) -> dict:
    """Adds (setting, model, "best lr"): each seed's best over the learning rates of `grid` that the setting was run
    at (by any model: one grid for every model of a setting), for the seeds that ran all of them (a best over fewer
    would not be the same statistic)."""
    best: dict = defaultdict(dict)
    for setting, model in {k[:2] for k in scores}:
        ran = [lr for lr in grid if any(k[0] == setting and k[2] == lr for k in scores)]
        if not ran:  # a setting run at none of the grid's learning rates has no best over it
            continue
        runs = [scores.get((setting, model, lr), {}) for lr in ran]
        for seed in set.intersection(*(set(r) for r in runs)):
            best[(setting, model, "best lr")][seed] = max(r[seed] for r in runs)
    return {**scores, **best}


def mean_sd(values) -> tuple[float, float]:
    values = list(values)
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else float("nan")


def paired(model: dict, baseline: dict) -> dict | None:
    """model - baseline over the seeds both ran: mean, standard error, seeds in favour, seeds compared."""
    seeds = sorted(set(model) & set(baseline))
    if not seeds:
        return None
    d = [model[s] - baseline[s] for s in seeds]
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
    return {"mean": statistics.fmean(d), "se": se, "favour": sum(x > 0 for x in d), "n": len(d)}


def spread(x: float) -> str:
    return "" if math.isnan(x) else f" ± {100 * x:.1f}"  # one seed: no spread to show


def report(scores: dict, baseline: str | None = None) -> str:
    lines = []
    for setting in sorted({k[0] for k in scores}):
        keys = sorted((k for k in scores if k[0] == setting), key=lambda k: (lr_order(k[2]), k[1]))
        lines += [f"{setting}: best evaluation of each run, %", "",
                  "| model | lr | seeds | mean ± sd | each seed |", "|---|---|---:|---:|---|"]
        for _, model, lr in keys:
            by_seed = scores[(setting, model, lr)]
            mu, sd = mean_sd(by_seed.values())
            each = ", ".join(f"s{s} {100 * v:.1f}" for s, v in sorted(by_seed.items()))
            lines.append(f"| {model} | {lr} | {len(by_seed)} | {100 * mu:.1f}{spread(sd)} | {each} |")
        if baseline:
            lines += ["", f"{setting}, difference from *{baseline}* seed by seed (points):", ""]
            lines += differences(scores, [setting], keys, baseline, "seeds in favour")
        lines.append("")
    settings = sorted({k[0] for k in scores})
    if baseline and len(settings) > 1:  # the same model and lr in every setting: one test over all the pairs
        keys = sorted({(None, *k[1:]) for k in scores}, key=lambda k: (lr_order(k[2]), k[1]))
        lines += [f"{' + '.join(settings)}, difference from *{baseline}*, (setting, seed) pairs pooled (points):", ""]
        lines += differences(scores, settings, keys, baseline, "pairs in favour") + [""]
    return "\n".join(lines)


def differences(scores: dict, settings: list[str], keys, baseline: str, favour: str) -> list[str]:
    """The table of model - baseline at each (model, lr) of keys, over the (setting, seed) pairs of `settings`."""
    lines = [f"| model | lr | mean ± s.e. | {favour} |", "|---|---|---:|---:|"]
    for _, model, lr in keys:
        if model.endswith(baseline):
            continue
        ours, base = {}, {}
        for setting in settings:
            b = next((v for k, v in scores.items() if k[0] == setting and k[2] == lr and k[1].endswith(baseline)), {})
            ours.update({(setting, s): v for s, v in scores.get((setting, model, lr), {}).items()})
            base.update({(setting, s): v for s, v in b.items()})
        p = paired(ours, base)
        if p:
            lines.append(f"| {model} | {lr} | {100 * p['mean']:+.1f}{spread(p['se'])} | {p['favour']} of {p['n']} |")
    return lines


def lr_order(lr: str) -> tuple:
    try:
        return (0, float(lr))
    except ValueError:  # "task" and "best lr" after the numbers
        return (1, lr)


def plot(scores: dict, path: Path) -> None:
    """One row of panels per setting, one panel per learning rate: a dot per seed, a bar at the mean."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    settings = sorted({k[0] for k in scores})
    lrs = sorted({k[2] for k in scores}, key=lr_order)
    fig, axes = plt.subplots(len(settings), len(lrs), figsize=(2.6 * len(lrs), 2.8 * len(settings)), dpi=120,
                             squeeze=False, sharey=True)
    for ax_row, setting in zip(axes, settings):
        for ax, lr in zip(ax_row, lrs):
            models = sorted(k[1] for k in scores if k[0] == setting and k[2] == lr)
            for i, model in enumerate(models):
                by_seed = scores[(setting, model, lr)]
                ax.scatter([i] * len(by_seed), [100 * v for v in by_seed.values()], color=f"C{i}", s=14, zorder=3)
                ax.hlines(100 * statistics.fmean(by_seed.values()), i - 0.3, i + 0.3, color=f"C{i}", lw=2)
            ax.set_xticks(range(len(models)), [m.rsplit("-", 1)[-1] for m in models], fontsize=7)
            if not models:
                ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes, fontsize=8)
            ax.set_title(f"{setting}, " + (lr if lr == "best lr" else f"lr {lr}"), fontsize=8)
            ax.set_ylim(0, 100)
            ax.grid(alpha=0.3, axis="y")
        ax_row[0].set_ylabel("best accuracy, %")
    fig.suptitle("dot: a seed; bar: the mean", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def curves(paths, path: Path, metric: str, setting: str | None = None, max_step: int | None = None) -> None:
    """One row per (setting, model, lr): each seed's evaluations over training (accuracy within the training length
    solid, beyond it dashed: the task's val_acc and val_acc_extrap; against tokens seen where the records know the
    tokens a step, else steps), and its accuracy against length (the val_acc@L columns) at its best evaluation by
    `metric`: where a run stands, not only its best number."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups: dict = defaultdict(dict)
    for key, seed, run in named_runs(paths, max_step):
        evals = [e for e in run["evaluations"] if e.get("val_acc") is not None]
        if evals and (not setting or re.search(setting, key[0])):  # none by --max-step: nothing to draw of it
            groups[key][seed] = (evals, run.get("tokens_per_step"))
    if not groups:
        raise SystemExit("no run with evaluations to draw")
    fig, axes = plt.subplots(len(groups), 2, figsize=(10, 3.2 * len(groups)), dpi=120, squeeze=False)
    for (left, right), (key, by_seed) in zip(axes, sorted(groups.items())):
        in_tokens = all(per_step for _, per_step in by_seed.values())  # the x axis: tokens seen where known
        for seed, (evals, per_step) in sorted(by_seed.items()):
            color = f"C{seed % 10}"
            x = [e["step"] * per_step / 1e9 if in_tokens else e["step"] for e in evals]
            left.plot(x, [100 * e["val_acc"] for e in evals], color=color, lw=1, label=f"seed {seed}")
            if any("val_acc_extrap" in e for e in evals):
                left.plot(x, [100 * e.get("val_acc_extrap", math.nan) for e in evals], color=color, lw=1, ls="--")
            best = max(evals, key=lambda e: e.get(metric, -math.inf))
            lengths = sorted(int(k.split("@")[1]) for k in best if k.startswith("val_acc@"))
            right.plot(lengths, [100 * best[f"val_acc@{n}"] for n in lengths], color=color, marker=".",
                       label=f"seed {seed}, step {best['step']:,}")
        left.set_title(f"{key[0]} {key[1]}, lr {key[2]}: solid within the training length, dashed beyond", fontsize=8)
        accuracy_axes(left, "tokens seen, billions" if in_tokens else "step")
        right.set_title(f"accuracy at each length, each seed's best evaluation by {metric}", fontsize=8)
        accuracy_axes(right, "length")
    fig.tight_layout()
    fig.savefig(path)


def accuracy_axes(ax, xlabel: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel("accuracy, %")
    ax.set_ylim(0, 101)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)


def finals(paths, setting: str | None = None) -> dict:
    """{(setting, model, lr): {curve: {seed: {length: accuracy}}}} of the finished runs that kept their final curves
    (task_eval.json's curve, curve_char, ...; a later file's run of the same name wins)."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for key, seed, run in named_runs(paths):
        if setting and not re.search(setting, key[0]):
            continue
        for name, curve in run.items():
            if name.startswith("curve") and isinstance(curve, dict):
                out[key][name][seed] = {int(n): a for n, a in curve.items()}
    if not out:
        raise SystemExit("no finished run with final curves (task_eval.json's curve*) in these records")
    return {k: dict(v) for k, v in out.items()}


def curve_names(by_key: dict) -> list[str]:
    """The final curves any model of finals() kept (curve, curve_char, ...), sorted."""
    return sorted({name for curves_ in by_key.values() for name in curves_})


def final_table(by_key: dict) -> str:
    """Per curve, one row per model: the mean over seeds (and sd, with several) at each length, in %."""
    lines = []
    for name in curve_names(by_key):
        rows = {k: v[name] for k, v in sorted(by_key.items()) if name in v}
        lengths = sorted({n for by_seed in rows.values() for c in by_seed.values() for n in c})
        lines += [f"{name}: final accuracy, %, mean ± sd over seeds", "",
                  "| setting | model | lr | seeds | " + " | ".join(map(str, lengths)) + " |",
                  "|---|---|---|---:|" + "---:|" * len(lengths)]
        for (setting, model, lr), by_seed in rows.items():
            cells = []
            for n in lengths:
                xs = [100 * c[n] for c in by_seed.values() if n in c]
                cells.append(f"{statistics.mean(xs):.1f}" + (f" ± {statistics.stdev(xs):.1f}" if len(xs) > 1 else "")
                             if xs else "")
            seeds = ",".join(map(str, sorted(by_seed)))
            lines.append(f"| {setting} | {model} | {lr} | {seeds} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot_finals(by_key: dict, path: Path) -> None:
    """One panel per curve (strings right, letters right, ...): a colour per model, a thin line per seed, a thick one
    for the mean over seeds, against length."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = curve_names(by_key)
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 3.8), dpi=120, squeeze=False)
    for ax, name in zip(axes[0], names):
        for i, (key, curves_) in enumerate(sorted(by_key.items())):
            by_seed = curves_.get(name, {})
            if not by_seed:
                continue
            color = f"C{i % 10}"
            for c in by_seed.values():
                ax.plot(sorted(c), [100 * c[n] for n in sorted(c)], color=color, lw=0.7, alpha=0.5)
            lengths = sorted(set.intersection(*(set(c) for c in by_seed.values())))
            ax.plot(lengths, [100 * statistics.mean(c[n] for c in by_seed.values()) for n in lengths], color=color,
                    lw=2, marker=".", label=f"{key[1]}" + ("" if key[2] == "task" else f", lr {key[2]}")
                    + f" ({len(by_seed)} seed{'s' if len(by_seed) > 1 else ''})")
        what = {"curve": " (positions right; copying: strings right)", "curve_char": " (letters right)",
                "curve_seq": " (sequences right at every position to the length)"}.get(name, "")
        ax.set_title(f"{name}{what}: the trained model (thin: a seed, thick: the mean)", fontsize=8)
        accuracy_axes(ax, "length")
    fig.tight_layout()
    fig.savefig(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", nargs="+", type=Path)
    ap.add_argument("--setting", help="a regex on the setting (the job name's first part), e.g. mqar256x16")
    ap.add_argument("--metric", default="val_acc")
    ap.add_argument("--max-step", type=int, help="count only evaluations up to this step (runs of different lengths "
                    "compared at one budget)")
    ap.add_argument("--baseline", help="the model (a suffix of its name, e.g. nope) to compare with seed by seed")
    ap.add_argument("--best-over", help="a comma list of learning rates (as the run names spell them): add each "
                    "seed's best over them, for the seeds that ran them all")
    ap.add_argument("--out", type=Path, help="a PNG of every seed's score")
    ap.add_argument("--curves", type=Path, help="a PNG of every run's evaluations over training and of its accuracy "
                    "against length at its best evaluation")
    ap.add_argument("--final", type=Path, help="a PNG (and a printed table) of finished runs' final curves against "
                    "length, the mean over seeds")
    ap.add_argument("--record", type=Path, help="write the run folders given as a run record (JSON) to this path")
    ap.add_argument("--note", default="", help="--record: what the runs are (command, budget, calls)")
    ap.add_argument("--device", default="", help="--record: where they ran")
    ap.add_argument("--software", default="", help="--record: torch, Triton, FLA versions")
    args = ap.parse_args()
    if missing := [str(p) for p in args.records if not p.exists()]:
        raise SystemExit(f"no such record or run folder: {', '.join(missing)}")
    if args.record:
        rec = record(args.records, args.note, args.device, args.software)
        args.record.write_text(json.dumps(rec, indent=1) + "\n")
        print(f"wrote {args.record}: {len(rec['runs'])} runs")
    scores = load(args.records, args.metric, args.max_step)
    if args.setting:
        scores = {k: v for k, v in scores.items() if re.search(args.setting, k[0])}
        if not scores:
            raise SystemExit(f"no run's setting matches {args.setting!r}")
    if args.best_over:
        scores = with_best_lr(scores, args.best_over.split(","))
    print(report(scores, args.baseline))
    if args.out:
        plot(scores, args.out)
        print(f"wrote {args.out}")
    if args.curves:
        curves(args.records, args.curves, args.metric, args.setting, args.max_step)
        print(f"wrote {args.curves}")
    if args.final:
        by_key = finals(args.records, args.setting)
        print(final_table(by_key))
        plot_finals(by_key, args.final)
        print(f"wrote {args.final}")


if __name__ == "__main__":
    main()
