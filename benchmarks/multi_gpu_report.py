"""Compare the loss curves and throughput of benchmarks/multi_gpu.sh's runs: OUT/multi_gpu.json, .md, .png.

    python benchmarks/multi_gpu_report.py OUT_DIR
"""

import json
import statistics
import sys
from pathlib import Path

from duality.common.io import write_atomic
from duality.common.plots import save_figure

# group -> (reference run, {run: label})
GROUPS = {
    "curves": ("gpu1", {"gpu1": "1 GPU (micro 32 x accum 2)", "gpu1_repeat": "1 GPU, the same run repeated",
                        "gpu1_micro16": "1 GPU (micro 16 x accum 4)",
                        "gpu2_ddp": "2 GPUs DDP (micro 32 x accum 1)", "gpu2_resume": "2 GPUs DDP, resumed at step 100",
                        "gpu2_fsdp": "2 GPUs FSDP2 (micro 32 x accum 1)"}),
    "fp32": ("fp32_gpu1", {"fp32_gpu1": "1 GPU fp32", "fp32_gpu2_ddp": "2 GPUs DDP fp32",
                           "fp32_gpu2_fsdp": "2 GPUs FSDP2 fp32"}),
    "scaling": ("scale_gpu1", {"scale_gpu1": "1 GPU (accum 8)", "scale_gpu2_ddp": "2 GPUs DDP (accum 4)",
                               "scale_gpu2_fsdp": "2 GPUs FSDP2 (accum 4)",
                               "scale_gpu2_fsdp_reshard": "2 GPUs FSDP2 (accum 4), re-sharded every micro-batch",
                               "scale_gpu4_ddp": "4 GPUs DDP (accum 2)", "scale_gpu4_fsdp": "4 GPUs FSDP2 (accum 2)",
                               "scale_gpu4_fsdp_reshard": "4 GPUs FSDP2 (accum 2), re-sharded every micro-batch"}),
    "dcp": ("dcp_fsdp2", {"dcp_fsdp2": "2 GPUs FSDP2, sharded checkpoints",
                          "dcp_resume2": "2 GPUs FSDP2, resumed at 30",
                          "dcp_resume1": "1 GPU, resumed at 30 (2 -> 1)", "dcp_async": "2 GPUs FSDP2, asynchronous"}),
    "cp": ("cp_gpu1", {"cp_gpu1": "1 GPU, whole sequences", "cp_gpu2": "2 GPUs, each sequence split in 2",
                       "cp_gpu4": "4 GPUs, each sequence split in 4"}),
}


def rows(path: Path) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if "loss" in r:
            out[r["step"]] = r
    return out


def compare(out: Path, ref_name: str, labels: dict) -> tuple[dict, dict]:
    runs = {k: rows(out / f"{k}.metrics.jsonl") for k in labels if (out / f"{k}.metrics.jsonl").exists()}
    ref, res = runs.get(ref_name), {}
    for name, r in runs.items():
        common = sorted(set(r) & set(ref)) if ref else []
        diffs = [abs(r[s]["loss"] - ref[s]["loss"]) for s in common]
        skip = 20 if max(r) > 40 else min(r)  # past compilation and warm-up (the first logged row at least)
        tps = [r[s]["tokens_per_s"] for s in sorted(r) if s > skip] or [r[max(r)]["tokens_per_s"]]
        same = next((s for s in common if r[s]["loss"] != ref[s]["loss"]), None)
        res[name] = {"label": labels[name], "steps": [min(r), max(r)], "final_loss": r[max(r)]["loss"],
                     "first_step_apart": same,  # the first common step whose loss is not bit-equal to the reference's
                     "max_abs_loss_diff": max(diffs) if diffs else None,
                     "mean_abs_loss_diff": statistics.mean(diffs) if diffs else None,
                     "tokens_per_s_median": statistics.median(tps),
                     "peak_mem_gib": max((x.get("peak_mem_gib") or 0) for x in r.values())}
    for v in res.values():
        v["speedup"] = v["tokens_per_s_median"] / res[ref_name]["tokens_per_s_median"] if ref_name in res else None
    return runs, res


def main(out: Path):
    device = (out / "device.txt").read_text().strip() if (out / "device.txt").exists() else None
    report, lines, curves = {"device": device}, [f"device: {device}"], {}
    for group, (ref_name, labels) in GROUPS.items():
        runs, res = compare(out, ref_name, labels)
        if not res:
            continue
        report[group] = res
        curves[group] = runs
        lines += ["", f"### {group} (differences and speed-up against: {labels[ref_name]})", "",
                  "| run | steps | final loss | max abs loss diff | mean abs loss diff | tokens/s (median) | "
                  "speed-up | peak GiB |", "|---|---|---|---|---|---|---|---|"]
        for v in res.values():
            f = (lambda x: "-" if x is None else f"{x:.2e}")
            f2 = (lambda x: "-" if x is None else f"{x:.2f}")
            lines.append(f"| {v['label']} | {v['steps'][0]}-{v['steps'][1]} | {v['final_loss']:.4f} | "
                         f"{f(v['max_abs_loss_diff'])} | {f(v['mean_abs_loss_diff'])} | "
                         f"{v['tokens_per_s_median']:,.0f} | {f2(v['speedup'])} | {v['peak_mem_gib']:.1f} |")
        if group == "curves" and {"gpu2_ddp", "gpu2_resume"} <= set(runs):
            a, b = runs["gpu2_ddp"], runs["gpu2_resume"]
            report["resume_max_abs_loss_diff"] = max(abs(a[s]["loss"] - b[s]["loss"]) for s in b)
            lines.append(f"\nresumed vs uninterrupted 2-GPU run, steps {min(b)}-{max(b)}: max abs loss difference "
                         f"{report['resume_max_abs_loss_diff']:.2e}")
    write_atomic(out / "multi_gpu.json", json.dumps(report, indent=1))
    write_atomic(out / "multi_gpu.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    if "curves" in curves:
        def draw(axes):
            ax = axes[0]
            for name, r in curves["curves"].items():
                s = sorted(r)
                ax.plot(s, [r[x]["loss"] for x in s], label=GROUPS["curves"][1][name], lw=1.2,
                        ls="--" if "resume" in name else "-")
            ax.set(xlabel="step", ylabel="training loss (mean of 10 steps)",
                   title=f"124m transformer + RoPE, 65,536-token batches, bf16, {(device or '').split(',')[0]}")
            ax.legend(fontsize=8)
        save_figure(out / "multi_gpu.png", draw, figsize=(7, 4))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
