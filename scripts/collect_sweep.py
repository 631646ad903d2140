"""Collect a sweep into one table and one figure: a synthetic-task sweep best over the optimiser settings, a
language-model sweep run by run.

    python scripts/collect_sweep.py outputs/multirun/2026-11-22_10-00-00 [more sweep dirs] [--out DIR] \
        [--metric val_acc]

A language-model sweep (no task_eval.json: runs on text data) gives one row per run with what the sweep varied, its
last and best validation loss and perplexity and the tokens it saw (results_lm.md, results_lm.csv) and the
validation loss against tokens of every run (results_lm.png), from each run's config.yaml and metrics.jsonl.

Reads every <dir>/**/task_eval.json that train.py writes at the end of a task run. Runs that differ only in the
optimiser (optim.lr, optim.weight_decay, ...) are one cell; the cell reports the best of them by --metric (seed 004's
"best over learning rates"), ties to the lower validation loss as on the results page (common/grid.rank). Rows are
models (backbone + positional scheme with its non-default flags, and any other model/backbone field the sweep varies);
columns are task settings (the task and any data field the sweep varies). Writes results.md, results.csv, results.png
(accuracy vs length of each cell's best run) and results_training.png (its evaluations during training: accuracy vs
tokens seen, from the run's metrics.jsonl) to --out (default: the first sweep dir). State-tracking cells add the
seed's sequence accuracy (every position up to L right); copying cells the seed's character accuracy (and
results_letters.png).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
from duality.common.grid import rank  # noqa: E402
from duality.data.tasks import SCORES, draw_curves  # noqa: E402

IGNORED = {"cache_dir"}


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list) else v
    return out


def pe_label(pe: dict) -> str:
    """The scheme's name and the options it sets away from conf/pe/<name>.yaml."""
    path = ROOT / "conf" / "pe" / f"{pe['name']}.yaml"
    base = yaml.safe_load(path.read_text()) if path.exists() else {}
    base = {k: v for k, v in (base or {}).items() if k != "defaults"}
    changed = [k if v is True else f"{k}={v}" for k, v in pe.items() if k != "name" and k in base and base[k] != v]
    return pe["name"] + (f"({', '.join(changed)})" if changed else "")


def load(dirs) -> list[dict]:
    runs = []
    for d in dirs:
        for f in sorted(Path(d).rglob("task_eval.json")):
            r = json.loads(f.read_text())
            r["dir"] = str(f.parent)
            runs.append(r)
    return runs


def load_lm(dirs) -> list[dict]:
    """Every run of a language-model sweep: its config and the validation rows of its metrics.jsonl."""
    runs = []
    for d in dirs:
        for f in sorted(Path(d).rglob("metrics.jsonl")):
            if not (f.parent / "config.yaml").exists():
                continue
            rows = [json.loads(line) for line in f.read_text(errors="replace").splitlines() if line.strip()]
            val = [r for r in rows if "val_loss" in r]
            if val:
                runs.append({"config": yaml.safe_load((f.parent / "config.yaml").read_text()), "val": val,
                             "tokens": max((r.get("tokens") or 0) for r in rows), "dir": str(f.parent)})
    return runs


def write_table(stem: Path, text: str, table: list[dict]) -> None:
    """stem.md (the markdown table) and stem.csv (its rows)."""
    stem.with_suffix(".md").write_text(text)
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)


def collect_lm(runs, out: Path) -> str:
    """results_lm.md / .csv / .png of a language-model sweep; returns the table."""
    keys = [k for p in ("backbone", "pe", "model", "optim", "data", "train") for k in varying(runs, p)
            if k.split(".")[-1] not in ("seed", "out_dir")]
    seed_varies = len({r["config"].get("seed") for r in runs}) > 1
    keys += ["seed"] if seed_varies else []
    table = []
    for r in runs:
        c = r["config"]
        flat = {k: v for p in ("backbone", "pe", "model", "optim", "data", "train")
                for k, v in flatten(c.get(p, {}), p + ".").items()}
        flat["seed"] = c.get("seed")
        last, best = r["val"][-1], min(r["val"], key=lambda v: v["val_loss"])
        table.append({"run": f"{c['backbone']['name']} + {pe_label(c['pe'])}", **{k: flat.get(k) for k in keys},
                      "step": last.get("step"), "val_loss": last["val_loss"],
                      "val_ppl": math.exp(min(last["val_loss"], 50)), "best_val_loss": best["val_loss"],
                      "tokens": r["tokens"], "dir": r["dir"]})
    order = sorted(range(len(table)), key=lambda i: table[i]["val_loss"])
    table, runs = [table[i] for i in order], [runs[i] for i in order]
    head = ["run", *keys, "step", "val_loss", "val_ppl", "best_val_loss", "tokens"]
    lines = [f"Language-model sweep: {len(runs)} runs, by the last validation loss.", "",
             "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for t in table:
        lines.append("| " + " | ".join(f"{t[h]:.4f}" if isinstance(t[h], float) and h != "tokens" else
                                       (f"{t[h]:,}" if h == "tokens" else str(t[h])) for h in head) + " |")
    text = "\n".join(lines) + "\n"
    write_table(out / "results_lm", text, table)
    try:
        import matplotlib
    except ImportError:
        return text
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for t, r in zip(table, runs):
        per_step = r["tokens"] / max(r["val"][-1]["step"], 1)
        label = t["run"] + "".join(f" {k.split('.')[-1]}={t[k]}" for k in keys if k not in ("backbone.name", "pe.name"))
        ax.plot([v["step"] * per_step for v in r["val"]], [v["val_loss"] for v in r["val"]], marker=".", label=label)
    ax.set_xlabel("tokens seen")
    ax.set_ylabel("validation loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "results_lm.png")
    return text


def varying(runs, prefix: str) -> list[str]:
    """Config keys under prefix that take more than one value across the runs."""
    values = defaultdict(set)
    for r in runs:
        for k, v in flatten(r["config"].get(prefix, {}), prefix + ".").items():
            values[k].add(str(v))
    return sorted(k for k, v in values.items() if len(v) > 1 and k.split(".")[-1] not in IGNORED)


def collect(runs, metric: str):
    row_keys = [k for k in varying(runs, "model") + varying(runs, "backbone") if k not in ("model.seq_len",)]
    col_keys = varying(runs, "data")
    seed_varies = len({r["config"]["seed"] for r in runs}) > 1
    cells = defaultdict(list)
    for r in runs:
        c = r["config"]
        flat = {**flatten(c["model"], "model."), **flatten(c["backbone"], "backbone."), **flatten(c["data"], "data.")}
        row = " ".join([f"{c['backbone']['name']} + {pe_label(c['pe'])}"] + [f"{k.split('.', 1)[1]}={flat[k]}"
                                                                          for k in row_keys if k != "backbone.name"])
        if seed_varies:
            row += f" seed={c['seed']}"
        col = " ".join([r["task"]] + [f"{k.split('.', 1)[1]}={flat[k]}" for k in col_keys if k != "data.name"])
        cells[(row, col)].append(r)
    # the results page's rule (common/grid.rank): the metric, then the lower validation loss
    return {key: max(rs, key=lambda r: rank(r, metric)) for key, rs in cells.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--metric", default="val_acc", help="what 'best' maximises: val_acc (default) or val_acc_extrap")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = Path(args.out or args.dirs[0])
    runs = load(args.dirs)
    if not runs:  # no synthetic-task run: a language-model sweep, run by run
        lm = load_lm(args.dirs)
        if not lm:
            raise SystemExit(f"no finished run under {', '.join(map(str, args.dirs))}: neither a task_eval.json (a "
                             "synthetic-task sweep) nor a metrics.jsonl with a validation loss beside a config.yaml "
                             "(a language-model sweep)")
        out.mkdir(parents=True, exist_ok=True)
        print(collect_lm(lm, out))
        print(f"wrote {out / 'results_lm.md'}, {out / 'results_lm.csv'}, {out / 'results_lm.png'}")
        return
    best = collect(runs, args.metric)
    rows = sorted({r for r, _ in best})
    cols = sorted({c for _, c in best})
    out.mkdir(parents=True, exist_ok=True)

    def fmt(r, key):
        v = r.get(key)
        return "-" if v is None else f"{100 * v:.1f}"

    extrap = any(r.get("val_acc_extrap") is not None for r in best.values())
    seq = any(r.get("val_seq_acc") is not None for r in best.values())
    lines = [f"Best over optimiser settings by {args.metric}; accuracy in % up to the training length"
             + (" / beyond it" if extrap else "")
             + ("; all right: sequences right at every position up to the training length / the longest" if seq else "")
             + f" ({len(runs)} runs).", "",
             "| model | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    table = []
    for row in rows:
        cells = []
        for col in cols:
            r = best.get((row, col))
            if r is None:
                cells.append("")
                continue
            lr = r["config"]["optim"]["lr"]
            text = fmt(r, "val_acc") + (f" / {fmt(r, 'val_acc_extrap')}" if extrap else "")
            if r.get("val_seq_acc") is not None:
                text += f"; all right {fmt(r, 'val_seq_acc')} / {fmt(r, 'val_seq_acc_extrap')}"
            if r.get("val_char_acc") is not None:
                text += f"; letters {fmt(r, 'val_char_acc')} / {fmt(r, 'val_char_acc_extrap')}"
            cells.append(f"{text} (lr {lr:g})")
            table.append({"model": row, "task": col, **{k: r.get(k) for k in SCORES}, "tokens": r.get("tokens"),
                          "lr": lr, "weight_decay": r["config"]["optim"]["weight_decay"], "dir": r["dir"]})
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    write_table(out / "results", text, table)

    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no results.png")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = len(cols)
    ncol = min(n, 3)
    nrow = math.ceil(n / ncol)
    for curve, name in (("curve", "results.png"), ("curve_char", "results_letters.png")):  # letters: copying
        if not any(curve in r for r in best.values()):
            continue
        fig, axes = plt.subplots(nrow, ncol, figsize=(5 * ncol, 3.4 * nrow), dpi=120, squeeze=False)
        for ax, col in zip(axes.flat, cols):
            runs = {row: best[(row, col)] for row in rows if (row, col) in best and curve in best[(row, col)]}
            first = next(iter(runs.values()))
            draw_curves(ax, {row: r[curve] for row, r in runs.items()}, first["train_len"], first["unit"],
                        col + (": letters right" if curve == "curve_char" else ""))
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.tight_layout()
        fig.savefig(out / name)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5 * ncol, 3.4 * nrow), dpi=120, squeeze=False)
    for ax, col in zip(axes.flat, cols):
        for i, row in enumerate(r for r in rows if (r, col) in best):
            pts = learning_curve(Path(best[(row, col)]["dir"]))
            for key, style in (("val_acc", "-"), ("val_acc_extrap", "--")):
                xy = [(p["tokens"], p[key]) for p in pts if p.get(key) is not None]
                if xy:
                    ax.plot(*zip(*xy), style, color=f"C{i}", label=row if key == "val_acc" else None, marker=".")
        ax.set_xlabel("tokens seen (dashed: beyond the training length)")
        ax.set_ylabel("accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(col, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out / "results_training.png")
    print(f"wrote {out / 'results.md'}, {out / 'results.csv'}, {out / 'results.png'}, {out / 'results_training.png'}")


def learning_curve(run_dir: Path) -> list[dict]:
    """The run's evaluations from metrics.jsonl, with the tokens seen at each (steps x tokens per step)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()] \
        if (run_dir / "metrics.jsonl").exists() else []
    per_step = next((r["tokens"] / r["step"] for r in rows if r.get("tokens") and r.get("step")), None)
    return [{**r, "tokens": r["step"] * per_step} for r in rows if "val_acc" in r and per_step]


if __name__ == "__main__":
    main()
