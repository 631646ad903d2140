"""The record and figure of benchmarks/scale.sh's runs: OUT/scale.json, scale.md, scale.png.

    python benchmarks/scale_report.py OUT

Throughput runs (tp_<size>_<backbone>_<strategy>_n<GPUs>): tokens/s (the median past the first third of the steps, at
most 10: compilation and warm-up), MFU, peak memory a GPU, and the scaling efficiency tokens/s(n) / (n tokens/s(1))
at the same batch a GPU. Loss runs (loss_n<GPUs>): the largest and mean difference of each step's loss from the
1-GPU run's. The sweep (sweep.jsonl): wall time on each count of GPUs (the latest where a count ran twice), and
each job's GPU and wall time (the launcher's launcher.jsonl), whose sum against the sweep's wall shows whether
spreading the jobs slowed each down.
"""

import json
import re
import statistics
import sys
from pathlib import Path

from duality.common.io import write_atomic
from duality.common.plots import save_figure


def rows(path: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines()) if "loss" in r}


def throughput(out: Path) -> dict:
    runs = {}
    for f in sorted(out.glob("tp_*_n*.metrics.jsonl")):
        config, n = re.fullmatch(r"tp_(.+)_n(\d+)\.metrics\.jsonl", f.name).groups()
        r = rows(f)
        steps = sorted(r)
        past = steps[min(10, len(steps) // 3):] or steps
        runs.setdefault(config, {})[int(n)] = {
            "tokens_per_s": statistics.median(r[s]["tokens_per_s"] for s in past),
            "mfu": statistics.median(r[s]["mfu"] for s in past) if r[past[0]].get("mfu") is not None else None,
            "peak_mem_gib": max((r[s].get("peak_mem_gib") or 0) for s in steps) or None,
            "steps": len(steps)}
    for by_n in runs.values():
        one = by_n.get(1)
        for n, v in by_n.items():
            v["efficiency"] = v["tokens_per_s"] / (n * one["tokens_per_s"]) if one else None
    return runs


def loss(out: Path) -> dict:
    runs = {int(re.fullmatch(r"loss_n(\d+)\.metrics\.jsonl", f.name).group(1)): rows(f)
            for f in out.glob("loss_n*.metrics.jsonl")}
    ref = runs.get(1)
    res = {}
    for n, r in sorted(runs.items()):
        diffs = [abs(r[s]["loss"] - ref[s]["loss"]) for s in sorted(set(r) & set(ref))] if ref else []
        res[n] = {"steps": len(r), "max_abs_loss_diff": max(diffs) if diffs else None,
                  "mean_abs_loss_diff": statistics.mean(diffs) if diffs else None}
    return res


def table(rec: dict) -> str:
    """The record's Markdown tables (a record read back from JSON has its GPU counts as strings)."""
    lines = ["| config | GPUs | tokens/s | × 1 GPU | efficiency | MFU | peak GiB a GPU |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for config, by_n in rec["throughput"].items():
        for n, v in sorted(by_n.items(), key=lambda kv: int(kv[0])):
            eff, mfu, mem = v["efficiency"], v["mfu"], v["peak_mem_gib"]
            cells = ["-" if eff is None else f"{int(n) * eff:.2f}", "-" if eff is None else f"{eff:.0%}",
                     "-" if mfu is None else f"{mfu:.3f}", "-" if mem is None else f"{mem:.1f}"]
            lines.append(f"| {config} | {n} | {v['tokens_per_s']:,.0f} | " + " | ".join(cells) + " |")
    if rec["loss"]:
        lines += ["", "| GPUs | fp32 loss difference to 1 GPU: max / mean |", "|---:|---|"]
        lines += [f"| {n} | {v['max_abs_loss_diff']:.2g} / {v['mean_abs_loss_diff']:.2g} |"
                  for n, v in rec["loss"].items() if v["max_abs_loss_diff"] is not None]
    if rec["sweep"]:
        lines += ["", "| sweep on | wall | jobs | the jobs' walls: sum / longest | exit code |",
                  "|---:|---:|---:|---:|---:|"]
        for s in rec["sweep"]:
            walls = [j["wall_s"] for j in s.get("jobs", [])]
            cells = f"{sum(walls):.0f} s / {max(walls):.0f} s" if walls else "-"
            lines.append(f"| {s['gpus']} GPUs | {s['wall_s']} s | {len(walls)} | {cells} | {s.get('rc', '-')} |")
    return "\n".join(lines)


def main(out: Path) -> dict:
    device = (out / "device.txt").read_text().strip() if (out / "device.txt").exists() else None
    sweep = [json.loads(x) for x in (out / "sweep.jsonl").read_text().splitlines()] if (out / "sweep.jsonl").exists() \
        else []
    sweep = list({s["gpus"]: s for s in sweep}.values())  # scale.sh appends: a count run again keeps its latest
    for s in sweep:  # each job's GPU and wall time (the launcher's own log): did spreading the jobs slow each down?
        log = out / f"sweep_{s['gpus']}gpu.launcher.jsonl"
        s["jobs"] = [{k: j[k] for k in ("job", "gpu", "wall_s", "status")} for j in
                     map(json.loads, log.read_text().splitlines())] if log.exists() else []
    rec = {"device": device, "throughput": throughput(out), "loss": loss(out), "sweep": sweep}
    lines = [f"device: {device}", "", table(rec)]
    write_atomic(out / "scale.json", json.dumps(rec, indent=1))
    write_atomic(out / "scale.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    if rec["throughput"]:
        def draw(axes):
            a, b = axes
            for config, by_n in rec["throughput"].items():
                ns = sorted(by_n)
                line, = a.plot(ns, [by_n[n]["tokens_per_s"] for n in ns], marker="o", label=config)
                if all(by_n[n]["efficiency"] is not None for n in ns):  # a config's colour in both panels
                    b.plot(ns, [100 * by_n[n]["efficiency"] for n in ns], marker="o", color=line.get_color())
            counts = sorted({n for by_n in rec["throughput"].values() for n in by_n})
            for ax in (a, b):
                ax.set_xscale("log", base=2)
                ax.set_xticks(counts, [str(n) for n in counts])  # 1, 2, 4, 8 rather than powers of 2
                ax.set_xlabel("GPUs")
                ax.grid(alpha=0.3)
            a.set(ylabel="tokens/s", title="throughput at a fixed batch a GPU")
            b.set(ylabel="% of linear scaling", title="scaling efficiency", ylim=(0, 110))
            a.legend(fontsize=7)
            a.figure.suptitle((device or "").split("\n")[0], fontsize=9)
        save_figure(out / "scale.png", draw, figsize=(11, 4), ncols=2)
    return rec


if __name__ == "__main__":
    main(Path(sys.argv[1]))
