"""The measured tables of README.md and docs/, drawn from their JSON records. (Over 500 lines on purpose: every
generated block of every page is drawn in this one file, so `--check`, a CI test, sees them all.)

    python scripts/report.py           # rewrite every generated block in place
    python scripts/report.py --check   # exit 1 naming each block that differs from its records (tests/test_report.py)

A generated block sits between `<!-- report:NAME -->` and `<!-- /report:NAME -->` in a Markdown file; BLOCKS maps
NAME to the function that draws it from its records. The device, date and software of each number come from the
record, never from prose, so a table cannot drift from the measurement behind it: change a record, rerun this.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the benchmarks', tools' and reproductions' own table functions
sys.path[:0] = [str(ROOT / d) for d in ("scripts", "benchmarks", "reproductions")]

import bench_train  # noqa: E402  (the benchmark's own table functions)
import longest_cp  # noqa: E402
import official_ab  # noqa: E402
import official_ab_copying  # noqa: E402
import results  # noqa: E402
import scale_report  # noqa: E402
import seed_spread  # noqa: E402

DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted(DOCS.glob("*/*.md"))]
THROUGHPUT = [DOCS / "throughput/bench_train_124m.json", DOCS / "throughput/bench_train_370m.json"]
VS_FLA = [DOCS / f"memory/{n}_370m_4096_h100.json" for n in ("fla_peers", "fused", "split", "profile", "peers_again")]
FIRST_STEP = DOCS / "gpu/first_step_h100.json"
FIRST_STEP_H200 = DOCS / "gpu/first_step_h200_2026-11-26.json"
FIRST_STEP_BLOCKS = DOCS / "gpu/first_step_h100_blocks_2026-11-27.json"
FIRST_STEP_H200_BLOCKS = DOCS / "gpu/first_step_h200_blocks_2026-11-27.json"
FIRST_STEP_H200_FRESH = DOCS / "gpu/first_step_h200_fresh_2026-11-27.json"
GPU_TEST_H200 = DOCS / "gpu/gpu_test_h200_2026-11-29.json"
FSDP2_PROFILE = DOCS / "multi_gpu/fsdp2_profile_4xh200_2026-11-27.json"
FSDP2_PROFILE_2 = DOCS / "multi_gpu/fsdp2_profile_2xh200_2026-11-27.json"
FSDP2_PROFILE_4_BF16 = DOCS / "multi_gpu/fsdp2_profile_4xh200_bf16_2026-11-27.json"
FSDP2_PREFETCH = DOCS / "multi_gpu/fsdp2_prefetch_4xh200_2026-11-27.json"
SCALE_4 = DOCS / "multi_gpu/scale_4xh200_2026-11-27.json"
SWEEP_S2 = DOCS / "multi_gpu/sweep_s2_2026-11-27.json"
SCALE_4B = DOCS / "multi_gpu/scale_4xh200_2026-11-27b.json"  # the same kind of machine, later: GLA, GDN, the sweep
SCALE_4C = DOCS / "multi_gpu/scale_4xh200_2026-11-28.json"  # GLA and GDN on 1, 2, 4 GPUs, the 1.3B GLA on 2
SCALE_1D = DOCS / "multi_gpu/scale_1xh200_2026-11-28.json"  # the 1.3B GLA on 1 GPU, tuned shapes, another machine
SCALE_4E = DOCS / "multi_gpu/scale_4xh200_2026-11-28b.json"  # the 1.3B GLA on 1, 2 and 4 GPUs of one machine
LOSS_KERNEL = DOCS / "throughput/loss_kernel_h100_2026-11-27.json"
QUACK_SWIGLU = [DOCS / f"throughput/quack_swiglu_h200_{d}.json" for d in ("2026-11-27", "2026-11-28")]
GLA_QKV = DOCS / "throughput/gla_qkv_h200_2026-11-28.json"
QKV_OTHERS = DOCS / "throughput/qkv_split_h200_2026-11-28.json"  # RetNet, Mamba2, gated Oja, linear attention
GLA_LEVERS = DOCS / "throughput/gla_levers_h200_2026-11-28.json"  # quack's input cast in the graph; FLA as custom ops
GLA_DV = DOCS / "throughput/gla_dv_h200_2026-11-28.json"  # GLA backward's value gradient on tensor cores
GDN_V = DOCS / "throughput/gdn_v_h200_2026-11-28.json"  # DeltaNet's v convolved apart (reverted)
# decoding (benchmarks/bench_decode.py): the grid; GLA and the transformer again with FLA's GLA (the grid's run
# stopped at its time limit before them); FLA's GLA beside ours in one process; batch 1 after the decoding steps'
# kernels
DECODE_FLA = DOCS / "inference/decode_fla_h200_2026-11-29.json"
DECODE = [DOCS / "inference/decode_h200_2026-11-29.json", DOCS / "inference/decode_peers_h200_2026-11-29.json",
          DECODE_FLA, DOCS / "inference/decode_after_h200_2026-11-29.json",
          DOCS / "inference/decode_h200_2026-11-29_ddeb192.json",
          DOCS / "inference/decode_compiled_h200_2026-11-29.json"]
CLEAN_CLONE = DOCS / "ci/clean_clone.json"  # make test's time on a clean clone, CI's kind of machine
RETRIEVAL = DOCS / "eval/retrieval/retrieval_h200_2026-11-29.json"  # issue #74's five models, 512 -> 32k
PEERS_H200 = DOCS / "throughput/peers_h200_2026-11-28.json"  # GLA, Gated DeltaNet against FLA's; the profiles
QUACK_PARITY = DOCS / "throughput/quack_parity_370m_2xh200_2026-11-28.json"
EAGER_PARITY = DOCS / "throughput/eager_parity_370m_4xh200_2026-11-28.json"  # the protocol's same-math control
MLP_NUMERICS = DOCS / "throughput/mlp_numerics_h200_2026-11-28.json"
FLOAT8 = DOCS / "throughput/float8_1_3b_h200_2026-11-27.json"
FLOAT8_PARITY = DOCS / "throughput/float8_parity_1_3b_2xh200_2026-11-27.json"
LM_EVAL_BENCH = [DOCS / f"eval/lm_eval_bench_{n}.json" for n in ("h200_2026-11-26", "h100_2026-11-27",
                                                                    "h100_2026-11-27_0aa552c", "h200_2026-11-27",
                                                                    "h200_2026-11-27_graphs")]
COMPILE_SCOPE = [DOCS / "throughput/compile_scope_h100_2026-11-27.json",
                 DOCS / "throughput/compile_scope_cpu_2026-11-27.json"]
LONGEST = DOCS / "memory/longest_65536_h100_2026-11-25.json"
MULTI_GPU = DOCS / "multi_gpu/multi_gpu.json"
FSDP_1_3B = DOCS / "multi_gpu/fsdp2_1_3b_2xh100.json"
VERDICTS = DOCS / "synthetic/verdicts.json"
OFFICIAL_AB = DOCS / "synthetic/official_ab_s2_2026-11-26.json"
OFFICIAL_AB_COPYING = DOCS / "synthetic/official_ab_copying_2026-11-26.json"
CP_LONGEST = [DOCS / "multi_gpu/cp_longest_h100_2026-11-26.json", DOCS / "multi_gpu/cp_longest_h200_2026-11-26.json"]
SCALING_4 = DOCS / "multi_gpu/scaling_4xh100_2026-11-26.json"
NAMES = {"ref": "nanoGPT reference", "transformer+rope": "transformer + RoPE", "gla+nope": "GLA",
         "gated_deltanet+nope": "Gated DeltaNet", "fox+nope": "FoX", "sympow+rope": "sympow",
         "gla+selective_rope": "GLA + Selective RoPE"}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def short_device(text: str) -> str:
    """'2 x NVIDIA H100 80GB HBM3 (lent ...)' -> '2 × H100'; the GPU count from '2 x', 'two', a kind's '-x2' or a
    repeated name; parts of a record measured on several machines (';') each, joined by ' + '."""
    out = []
    for part in text.split(";"):
        chips = re.findall(r"H100|H200", part)
        if not chips:
            continue
        m = re.search(r"\b(\d+) x\b|\b(two|four|eight)\b|nvidia-h\d00-x(\d)", part, re.I)
        n = 1 if m is None else int(m.group(1) or m.group(3) or {"two": 2, "four": 4, "eight": 8}[m.group(2).lower()])
        n = max(n, part.count("NVIDIA H"))
        out.append(f"{n} × {chips[0]}" if n > 1 else chips[0])
    return " + ".join(dict.fromkeys(out)) or text


def link(page: str, text: str = "details") -> str:
    return f"[{text}]({page})"


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# ------------------------------------------------------------------------------------------------------ blocks
def throughput_table() -> str:
    return bench_train.summary(THROUGHPUT)


def vs_fla_table() -> str:
    return bench_train.vs_fla(VS_FLA)


def first_step_table(path: Path | None = None) -> str:
    rec = load(path or FIRST_STEP)
    lines = [f"| case ({rec['setting']}, compiled) | first step, s | configs timed | process wall, s |",
             "|---|---:|---:|---:|"]
    for r in rec["rows"]:
        lines.append(f"| {r['case']} | {r['first_step_s']:.1f} | {r['configs_timed']} | {r['process_wall_s']:.0f} |")
    return "\n".join(lines) + f"\n\n{short_device(rows_device(rec))}, {rows_date(rec)}; {rec['note']}."


def compile_scope_table() -> str:
    """scripts/compile_scope.py's records: each case's first step and step time, whole against block by block."""
    lines = ["| case | size, tokens | device | first step, s: whole / blocks | step, ms: whole / blocks | "
             "peak GiB: whole / blocks | graphs |", "|---|---|---|---:|---:|---:|---:|"]
    for path in COMPILE_SCOPE:
        rec = load(path)
        for case, (m, b) in _pairs(rec["rows"], "case", "scope", ("model", "blocks")).items():
            device = short_device(m["device"]) or m["device"].upper()
            lines.append(f"| {case} | {m['size']}, {m['batch']} × {m['seq_len']} | {device}, {rec['date']} | "
                         f"{m['first_step_s']:.1f} / {b['first_step_s']:.1f} | "
                         f"{m['step_s'] * 1e3:,.1f} / {b['step_s'] * 1e3:,.1f} | "
                         f"{_pair(m, b, 'peak_mem_gib', '.1f')} | "
                         f"{_pair(m, b, 'graphs', 'd')} |")
    return "\n".join(lines)


def _pairs(rows: list, key: str, side: str, sides: tuple) -> dict:
    """{rows' key value: (its row with side == sides[0], its row with side == sides[1])}, in the rows' order."""
    by = {(r[key], r[side]): r for r in rows}
    return {k: (by[k, sides[0]], by[k, sides[1]]) for k in dict.fromkeys(r[key] for r in rows)}


def _pair(a: dict, b: dict, key: str, fmt: str) -> str:
    """a[key] / b[key], or – where a record did not measure it (graphs on a GPU, memory on a CPU)."""
    return " / ".join("–" if r.get(key) is None else format(r[key], fmt) for r in (a, b))


def loss_kernel_table() -> str:
    """benchmarks/bench_loss.py (the loss alone, each way) and bench_train's steps with either model.fused_loss_impl."""
    rec = load(LOSS_KERNEL)
    lines = ["| shape | way | ms, forward + backward | peak GiB over the inputs |", "|---|---|---:|---:|"]
    for part in rec["loss"]:
        for r in part["rows"]:
            lines.append(f"| {part['shape']} | {r['way']} | {r['ms']:.2f} | {r['peak_gib']:.2f} |")
    lines += ["", "| case (370m/4096, compiled) | ms a step: chunked / triton | peak GiB: chunked / triton |",
              "|---|---:|---:|"]
    for case, (c, t) in _pairs(rec["steps"], "case", "impl", ("chunked", "triton")).items():
        lines.append(f"| {case} | {c['ms']:.1f} / {t['ms']:.1f} | {c['peak_mem_gib']:.1f} / {t['peak_mem_gib']:.1f} |")
    cmds = "; ".join(f"`{c}`" for c in [p["command"] for p in rec["loss"]] + rec["step_commands"])
    return "\n".join(lines) + f"\n\n{short_device(rec['device'])}, {rec['date']}, torch {rec['torch']}: {cmds}."


def float8_table() -> str:
    """bench_train.py --float8's record: each case in bf16 and with float8 Linear layers, and the ratio."""
    rec = load(FLOAT8)
    base = {r["case"]: r for r in rec["rows"] if ":float8-" not in r["case"]}
    lines = ["| case (size/context, compiled) | tokens a step | ms a step | MFU | × bf16 | peak GiB |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rec["rows"]:
        b = base[r["case"].split(":float8-")[0]]
        lines.append(f"| {r['case']} ({r['size']}/{r['seq_len']}) | {r['batch'] * r['seq_len']:,} | {r['ms']:.1f} | "
                     f"{r['mfu']:.3f} | {b['ms'] / r['ms']:.2f} | {r['peak_mem_gib']:.1f} |")
    return "\n".join(lines) + (f"\n\n{short_device(rec['device'])}, {rec['date']}, torch {rec['torch']}, "
                               f"{rec['packages']}, at {rec['code']}: `{rec['command']}`; {rec['note']}.")


def parity_table(path: Path, base: str = "bf16") -> str:
    """scripts/float8_parity.py's record: validation losses every 200 steps, the default runs' seed gap (named `base`
    here: bf16 for float8, inductor for quack), the other setting's paired gap, a seed's second half and its end."""
    rec = load(path)
    (recipe, v), = rec["verdict"].items()
    seeds = " / ".join(rec["seeds"])
    lines = [f"| step | {base}, seeds {seeds} | {base}'s gap | {recipe}, seeds {seeds} | "
             f"{recipe} − {base}, same seed |", "|---:|---:|---:|---:|---:|"]
    for row in rec["rows"]:
        if row["step"] % 200 == 0 or row["step"] == rec["rows"][-1]["step"]:
            r = row[recipe]
            lines.append(f"| {row['step']:,} | {' / '.join(f'{x:.4f}' for x in row['bf16'])} | "
                         f"{row['bf16_spread']:.4f} | {' / '.join(f'{x:.4f}' for x in r['loss'])} | "
                         f"{' / '.join(f'{x:+.4f}' for x in r['paired_diff'])} |")
    per_seed = (f" A seed's second half on average: {' / '.join(f'{x:+.4f}' for x in v['per_seed_late'])}; "
                f"{v['worse_final']} seeds above {base} at the end." if "per_seed_late" in v else "")
    speed = (f" {recipe.capitalize()} runs {rec['float8_speedup']:.2f}× {base}'s tokens/s here."
             if "float8_speedup" in rec else "")
    software = f"torchao {rec['torchao']}" if "torchao" in rec else rec["packages"]
    return "\n".join(lines) + (
        f"\n\nSecond half (steps {rec['rows'][len(rec['rows']) // 2]['step']:,}–{rec['steps'][-1]:,}): {recipe} − "
        f"{base} {v['mean_paired_diff_late']:+.4f} on average, {v['positive_late']} paired differences above 0; "
        f"{base}'s seed gap {v['mean_bf16_spread_late']:.4f} on average.{per_seed}{speed} "
        f"{short_device(rec['device'])}, {rec['date']}, torch {rec['torch']}, {software}: {rec['command']}; "
        f"{rec['note']}.")


def mlp_numerics_table() -> str:
    """benchmarks/mlp_numerics.py's record: each SwiGLU impl's distance from float64, output and gradients."""
    rec = load(MLP_NUMERICS)
    lines = ["| tokens | impl | rel. error: y / dx / dW13 / dW2 | bias along the reference: y / dx / dW13 / dW2 | "
             "two calls differ by |", "|---|---|---:|---:|---:|"]
    for shape, impls in rec["result"].items():
        for impl, r in impls.items():
            rel = " / ".join(f"{v['rel']:.4f}" for v in r.values())
            bias = " / ".join(f"{v['bias']:+.1e}" for v in r.values())
            repeat = [v["repeat"] for v in r.values()]
            lines.append(f"| {shape} | {impl} | {rel} | {bias} | "
                         f"{'not measured' if None in repeat else f'{max(repeat):g}'} |")
    return "\n".join(lines) + (f"\n\n{short_device(rec['device'])}, {rec['date']}, torch {rec['torch']}, "
                               f"{rec['packages']}, at {rec['code']}: `{rec['command']}`; {rec['note']}.")


def quack_pairs() -> list:
    """(record, case, its inductor row, its quack row) over the quack SwiGLU records, in order."""
    return [(rec, case, i, q) for rec in map(load, QUACK_SWIGLU)
            for case, (i, q) in _pairs(rec["rows"], "case", "impl", ("inductor", "quack")).items()]


def quack_swiglu_table() -> str:
    """bench_train's step with each model.mlp_impl, one process each on one machine, a line per record."""
    lines = ["| case (370m/4096, compiled) | date | ms a step: inductor / quack | quack's gain | MFU | peak GiB | "
             "first step, s |", "|---|---|---:|---:|---:|---:|---:|"]
    for rec, case, i, q in quack_pairs():
        lines.append(f"| {case} | {rec['date']} | {i['ms']:.1f} / {q['ms']:.1f} | {1 - q['ms'] / i['ms']:.1%} | "
                     f"{_pair(i, q, 'mfu', '.3f')} | {_pair(i, q, 'peak_mem_gib', '.1f')} | "
                     f"{_pair(i, q, 'first_step_s', '.1f')} |")
    notes = [f"{rec['date']}: {short_device(rec['device'])}, torch {rec['torch']}, {rec['packages']}: "
             + "; ".join(f"`{r['command']}`" for r in rec["rows"]) + f". {rec['gpu_test']}; {rec['note']}."
             for rec in map(load, QUACK_SWIGLU)]
    return "\n".join(lines) + "\n\n" + "\n\n".join(notes)


def runs_table(path: Path) -> str:
    """bench_train runs of a few ways to do one step (a mixer's q, k and v from one matmul or from three, FLA's models
    where run, a lever tried), each run's call and GPU beside it."""
    rec = load(path)
    lines = ["| call | GPU | way | case (370m/4096) | compiled | ms a step | tokens/s | MFU | peak GiB |",
             "|---|---:|---|---|---|---:|---:|---:|---:|"]
    for run in rec["runs"]:
        for r in run["rows"]:
            mfu = "-" if r["mfu"] is None else f"{r['mfu']:.3f}"
            lines.append(f"| {run['call'].split(':')[0]} | {run['gpu']} | {run['label']} | {r['case']} | "
                         f"{'yes' if r['compile'] else 'no'} | {r['ms']:.1f} | {r['tokens_per_s']:,.0f} | {mfu} | "
                         f"{r['peak_mem_gib']:.1f} |")
    calls = "; ".join(dict.fromkeys(run["call"] for run in rec["runs"]))
    cmds = "; ".join(f"`{run['command']}`" for run in rec["runs"])
    return "\n".join(lines) + (f"\n\n{rec['date']}, {rec['software']}, {rec['settings']}. Calls: {calls}. "
                               f"Commands: {cmds}. {rec['note']} Not run: {rec['not_run']}")


def profile_kinds(path: Path) -> tuple[float, dict]:
    """The unprofiled step (ms) and the ms a step of each kind of kernel, from the head of a `bench_train.py
    --profile` file (its kernel_breakdown); the GPU idle line is left out (the profiler's own lag inflates it)."""
    lines = path.read_text().splitlines()
    step = float(re.search(r"([\d.]+) ms a step unprofiled", lines[0]).group(1))
    kinds = {}
    for line in lines[2:]:
        m = re.match(r"(.+?)\s+([\d.]+)\s+[\d.]+%$", line)
        if not m:
            break
        if not m.group(1).startswith("GPU idle"):
            kinds[m.group(1)] = float(m.group(2))
    return step, kinds


MEMORY_BOUND = ("torch.compile (Inductor)", "PyTorch eager elementwise / reductions", "copies / fills")


def profiles_table() -> str:
    """Where each 370m step's GPU time goes, one column a backbone, from the profiles beside PEERS_H200; the
    memory-bound row sums what the performance issue counts as such (Inductor's kernels, eager element-wise, copies)."""
    rec = load(PEERS_H200)
    cols = {case: profile_kinds(DOCS / "throughput" / f) for case, f in rec["profiles"].items()}
    kinds = list(dict.fromkeys(k for _, ks in cols.values() for k in ks))
    lines = ["| ms a step | " + " | ".join(NAMES.get(c, c) for c in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for k in kinds:
        lines.append(f"| {k} | " + " | ".join(f"{ks.get(k, 0):.1f}" for _, ks in cols.values()) + " |")
    lines.append("| **memory-bound** (Inductor, eager element-wise, copies) | " +
                 " | ".join(f"**{sum(ks.get(k, 0) for k in MEMORY_BOUND):.1f}**" for _, ks in cols.values()) + " |")
    lines.append("| kernels in all | " + " | ".join(f"{sum(ks.values()):.1f}" for _, ks in cols.values()) + " |")
    lines.append("| the step, unprofiled | " + " | ".join(f"{st:.1f}" for st, _ in cols.values()) + " |")
    files = ", ".join(f"[{f}]({rel(DOCS / 'throughput' / f)})" for f in rec["profiles"].values())
    return "\n".join(lines) + (f"\n\n{short_device(rec['device'])}, {rec['date']}, {rec['software']}, "
                               f"{rec['settings']}, code {rec['code'].split(' ')[0]}; `benchmarks/bench_train.py "
                               f"--profile` (3 profiled steps after the timed ones): {files}.")


def lm_eval_bench_table() -> str:
    """bench_lm_eval.py beside the old adapter's bench, one or two rounds a record: requests/s of the three scorers,
    where a record timed them the two benches' eager forwards alone (each forward synchronised and timed), and the
    batched scorer with CUDA graphs (its default on a GPU since 2026-11-27)."""
    lines = ["| device, date, code | model | batch | loglikelihood req/s: HFLM / batched / adapter (each round) | "
             "batched / adapter | forwards alone, req/s: batched / adapter | batched + CUDA graphs, req/s "
             "(/ adapter) |", "|---|---|---|---|---:|---:|---:|"]
    for rec in map(load, LM_EVAL_BENCH):
        where = f"{short_device(rec['device'])}, {rec['date']}, {rec['code']}"
        for model, batch in dict.fromkeys((r["model"], r["batch"]) for r in rec["rows"]):
            rs = [r for r in rec["rows"] if (r["model"], r["batch"]) == (model, batch)]  # one per round
            rounds = " and ".join(f"{r['hflm_req_s']:,.0f} / {r['batched_req_s']:,.0f} / {r['adapter_req_s']:,.0f}"
                                  for r in rs)
            ratios = sorted(r["batched_req_s"] / r["adapter_req_s"] for r in rs)
            spread = f"{ratios[0]:.2f}" + (f"–{ratios[-1]:.2f}" if len(ratios) > 1 else "")
            alone = " and ".join(f"{r['batched_forward_req_s']:,.0f} / {r['adapter_forward_req_s']:,.0f}"
                                 for r in rs if "adapter_forward_req_s" in r) or "–"
            graphed = " and ".join(f"{r['graphed_req_s']:,.0f} ({r['graphed_req_s'] / r['adapter_req_s']:.1f}×)"
                                   for r in rs if "graphed_req_s" in r) or "–"
            lines.append(f"| {where} | {model} | {batch} | {rounds} | {spread} | {alone} | {graphed} |")
    return "\n".join(lines)


def rows_device(rec: dict) -> str:
    return rec.get("device") or rec["rows"][0]["device"]


def rows_date(rec: dict) -> str:
    return rec.get("date") or rec["rows"][0]["date"]


def longest_table() -> str:
    rec = load(LONGEST)
    lines = ["| backbone (370m, one 65,536-token sequence, full checkpointing) | s a step | peak GiB | tokens/s |",
             "|---|---:|---:|---:|"]
    for r in rec["rows"]:
        lines.append(f"| {NAMES.get(r['case'], r['case'])} | {r['ms'] / 1000:.2f} | {r['peak_mem_gib']:.1f} | "
                     f"{r['tokens_per_s']:,.0f} |")
    where = f"{short_device(rec['device'])}, {rec['date']}, torch {rec['torch']}"
    return "\n".join(lines) + f"\n\n{where}: `{rec['command']}`"


def activation_checkpointing_table() -> str:
    """train.activation_checkpointing's three modes side by side, from the three records of one session."""
    recs = {mode: load(DOCS / f"memory/ac_{mode}_h100_2026-11-25.json") for mode in ("none", "selective", "full")}
    cases = [r["case"] for r in recs["none"]["rows"]]
    lines = ["| train.activation_checkpointing | " + " | ".join(f"{NAMES.get(c, c)}: ms / GiB" for c in cases) + " |",
             "|---|" + "---:|" * len(cases)]
    for mode, rec in recs.items():
        rows = {r["case"]: r for r in rec["rows"]}
        lines.append(f"| {mode} | " + " | ".join(f"{rows[c]['ms']:.1f} / {rows[c]['peak_mem_gib']:.1f}" for c in cases)
                     + " |")
    rec = recs["none"]
    where = f"{short_device(rec['device'])}, {rec['date']}, torch {rec['torch']}, 370m, 8 × 4,096 tokens, compiled"
    return "\n".join(lines) + f"\n\n{where}: `{rec['command']}` (and the same with each mode)"


def multi_gpu_table() -> str:
    rec = load(MULTI_GPU)
    f, s = rec["fp32"], rec["scaling"]
    lines = ["| run | loss difference to 1 GPU: max / mean | tokens/s (median) | × 1 GPU | peak GiB a GPU |",
             "|---|---:|---:|---:|---:|"]
    for title, group in (("fp32, no compile, 20 steps of 65,536 tokens", f),
                         ("bf16, compiled, 262,144-token batches", s),
                         ("bf16, compiled, 200 steps of 65,536 tokens (the curves in the figure)", rec["curves"])):
        lines.append(f"| **{title}** | | | | |")
        for r in group.values():
            lines.append(f"| {r['label']} | {r['max_abs_loss_diff']:.2g} / {r['mean_abs_loss_diff']:.2g} | "
                         f"{r['tokens_per_s_median']:,.0f} | {r['speedup']:.2f} | {r['peak_mem_gib']:.1f} |")
    lines.append(f"| the 2-GPU run resumed from step 100, against itself uninterrupted | "
                 f"{rec['resume_max_abs_loss_diff']:.2g} | | | |")
    where = f"{short_device(rec['device'])}, {rec['date']}, {rec['software']}"
    return "\n".join(lines) + f"\n\n{where}: `bash benchmarks/multi_gpu.sh OUT`"


def dcp_table() -> str:
    """Sharded checkpoints on GPUs: each run against the uninterrupted FSDP2 run, step by step."""
    rec = load(DOCS / "multi_gpu/dcp_h100_2026-11-26.json")
    lines = ["| run | steps | bit-equal to the uninterrupted run until | loss difference after: max | peak GiB a GPU |",
             "|---|---|---:|---:|---:|"]
    for name, r in rec["runs"].items():
        apart = r["first_step_apart"]
        lines.append(f"| {r['label']} | {r['steps'][0]}–{r['steps'][1]} | "
                     f"{'the end' if apart is None else f'step {apart - 1}'} | {r['max_abs_loss_diff']:.1e} | "
                     f"{r['peak_mem_gib']:.1f} |")
    return "\n".join(lines) + f"\n\n{short_device(rec['device'])}, {rec['date']}, {rec['software']}: `{rec['command']}`"


def cp_longest_table() -> str:
    """One sequence split over 1, 2 and 4 GPUs of one machine: the longest that trains one step, per GPU kind."""
    parts = []
    for path in CP_LONGEST:
        rec = load(path)
        parts.append(f"**{short_device(rec['device'])}** ({rec['date']}, torch {rec['torch'].split('+')[0]}, "
                     f"[record](docs/{path.relative_to(DOCS)})):\n\n{longest_cp.table(rec['summary'])}")
    return "\n\n".join(parts)


def scaling_4_table() -> str:
    """DDP and FSDP2 on 4 GPUs at 124m: tokens/s against 1 GPU and against DDP."""
    rec = load(SCALING_4)
    lines = ["| run | tokens/s (median) | × 1 GPU | × DDP | loss difference to 1 GPU: max | peak GiB a GPU |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rec["runs"].values():
        lines.append(f"| {r['label']} | {r['tokens_per_s_median']:,.0f} | {r['speedup']:.2f} | {r['x_ddp']:.2f} | "
                     f"{r['max_abs_loss_diff']:.1e} | {r['peak_mem_gib']:.1f} |")
    return "\n".join(lines) + (f"\n\n{short_device(rec['device'])}, {rec['date']}, {rec['software']}: "
                              f"`{rec['command']}` ({rec['settings']})")


def official_ab_table() -> str:
    return official_ab.table(load(OFFICIAL_AB))


def official_ab_fits_table() -> str:
    return official_ab.fits_table(load(OFFICIAL_AB))


def official_ab_copying_table() -> str:
    return official_ab_copying.summary(load(OFFICIAL_AB_COPYING))


def official_ab_copying_steps_table() -> str:
    return official_ab_copying.table(load(OFFICIAL_AB_COPYING))


MQAR_GRID = ["1e-3", "2.2e-3", "4.6e-3", "1e-2", "2.2e-2", "4.6e-2"]


def mqar_seeds_table() -> str:
    """MQAR at d_model 64: each seed scored at its best learning rate of the grid, and each scheme's difference from
    NoPE seed by seed (seed_spread.py's tables, the best-lr rows)."""
    paths = sorted(DOCS.glob("synthetic/mqar_d64_*.json"))
    scores = {k: v for k, v in seed_spread.load(paths).items() if re.search("mqar256x16|mqar128x8", k[0])}
    text = seed_spread.report(seed_spread.with_best_lr(scores, MQAR_GRID), "nope")
    keep = [line for line in text.splitlines() if not line.startswith("| d64") or "| best lr |" in line]
    recs = [load(p) for p in paths]
    dates = sorted({r["date"] for r in recs})
    return "\n".join(keep) + (f"\n\n{short_device(recs[0]['device'])}, {' and '.join(dates)}; records "
                              f"{', '.join(p.name for p in paths)}; the grid: {', '.join(MQAR_GRID)}")


def fsdp2_calls_table(path: Path) -> str:
    """DDP and the FSDP2 variants of each call: untraced tokens/s, memory, the traced steps."""
    r = load(path)
    names = {"ddp": "DDP", "fsdp": "FSDP2", "fsdp_bf16": "FSDP2, bf16 gather",
             "fsdp_prefetch1": "FSDP2, prefetch 1 block", "fsdp_prefetch2": "FSDP2, prefetch 2 blocks"}
    lines = ["| 124m | call (steps) | tokens/s | of DDP | GiB a GPU | val loss | GPU busy, ms a traced step | "
             "exposed NCCL, ms |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for i, c in enumerate(r["calls"], 1):
        for k in c["steady_tokens_per_s"]:
            name = names[k]
            t = c["steady_tokens_per_s"][k]
            lines.append(f"| {name} | {i} ({', '.join(map(str, c['steady_steps']))}) | {t:,} | "
                         f"{t / c['steady_tokens_per_s']['ddp']:.1%} | {c['peak_mem_gib'][k]:.1f} | "
                         f"{c['final_loss'][k]['val']:.4f} | {c['profile'][k]['gpu_busy_ms']:.1f} | "
                         f"{c['profile'][k]['nccl_exposed_ms']:.1f} |")
    return "\n".join(lines) + f"\n\n{short_device(r['device'])}, {r['date']}, torch {r['torch']}: {r['command']}"


def scale_table(path: Path) -> str:
    """benchmarks/scale.sh's record: throughput against 1 GPU, fp32 losses, the sweep."""
    rec = load(path)
    return scale_report.table(rec) + (f"\n\n{rec['device']}, {rec['date']}: " +
                                      "; ".join(f"`{c}`" for c in rec["commands"]) + f" ({rec['settings']})")


def sweep_table() -> str:
    """The S2 sweep on one GPU and dealt over four: each job's wall time, or how far it got, and its pace."""
    rec = load(SWEEP_S2)
    lines = ["| job | 1 GPU (64 cores): wall, tokens/s at step 500 | 4 GPUs: GPU, step reached in 156 s, tokens/s at "
             "step 500 | 1 H200 (16 cores, 2 threads a job): wall |", "|---|---|---|---|"]
    for j in rec["jobs"]:
        a, b, c = j["x4_one_gpu"], j["x4_four_gpus"], j["h200_one_gpu_omp2"]
        lines.append(f"| {j['overrides']} | {a['wall_s']:.0f} s, {a['tokens_per_s_at_step_500']:,} | {b['gpu']}, "
                     f"{b['stopped_at_step']:,} of 1,954, {b['tokens_per_s_at_step_500']:,} | {c['wall_s']:.0f} s |")
    runs = {r["name"]: r for r in rec["runs"]}
    lines.append(f"| **the sweep** | **{runs['x4_one_gpu']['wall_s']} s** | stopped after "
                 f"{runs['x4_four_gpus']['stopped_after_s']} s | **{runs['h200_one_gpu_omp2']['wall_s']} s** |")
    return "\n".join(lines) + f"\n\n{rec['date']}, {rec['torch']}: `{rec['command']}`"


def fsdp_1_3b() -> tuple[float, float, float]:
    """(speedup of 2 GPUs over 1, GiB a GPU on 2, on 1) of the 1.3B FSDP2 record: the median of each run's rows."""
    runs = load(FSDP_1_3B)["runs"]

    def med(run, key):
        vals = sorted(r[key] for r in run["metrics"][1:] if key in r)  # the first row includes compilation
        return vals[len(vals) // 2]
    one, two = runs["1_gpu"], runs["2_gpu"]
    return med(two, "tokens_per_s") / med(one, "tokens_per_s"), med(two, "peak_mem_gib"), med(one, "peak_mem_gib")


def summary_table() -> str:
    """The README's results: one row a measured area, each number from its record, each row linking its page."""
    rows = []
    tp = {bench_train.key(r): r for path in THROUGHPUT for _, r in bench_train.load_rows(path)}
    rec = load(THROUGHPUT[1])
    cells = []
    for case in ("ref", "transformer+rope", "gla+nope", "gated_deltanet+nope"):
        r = tp.get((case, "370m", 4096, True))
        if r and "error" not in r:
            cells.append(f"{NAMES[case]} {r['ms']:.0f} ms (MFU {r['mfu']:.2f})" if r.get("mfu") else
                         f"{NAMES[case]} {r['ms']:.0f} ms")
    rows.append(("Training step, 370m, 8 × 4,096 tokens, compiled", "; ".join(cells),
                 f"{short_device(rec['device'])}, {rec['date']}", "docs/throughput/README.md"))
    # (GLA against FLA's GLAForCausalLM on an H100, 2026-11-25, superseded by the H200 row below: docs/memory)
    qkv = load(GLA_QKV)  # call A: GPU 2 ran the changed GLA and FLA's models, GPU 0 Gated DeltaNet
    gpu = {g: {r["case"]: r["ms"] for run in qkv["runs"] if run["call"].startswith("A") and run["gpu"] == g
               for r in run["rows"]} for g in (0, 2)}
    peers = load(PEERS_H200)  # one GPU: ours and FLA's, one process after the other (the profiles' rows left out)
    by = {}
    for run in peers["runs"]:
        if "--profile" not in run["command"]:
            for r in run["rows"]:
                by.setdefault(r["case"], []).append(r)
    cells = []
    for ours, fla, name in (("gla+nope", "fla:gla", "GLA"), ("gated_deltanet+nope", "fla:gated_deltanet",
                                                            "Gated DeltaNet")):
        x = sorted(f["ms"] / o["ms"] for o in by[ours] for f in by[fla])
        mem = max(o["peak_mem_gib"] for o in by[ours]) / min(f["peak_mem_gib"] for f in by[fla])
        cells.append(f"{name} {x[0]:.2f}{'' if f'{x[0]:.2f}' == f'{x[-1]:.2f}' else f'–{x[-1]:.2f}'}× their speed "
                     f"at {mem:.2f}× their memory")
    rows.append(("GLA and Gated DeltaNet against FLA's own models (370m, 8 × 4,096; ours compiled, FLA's eager, "
                 "one GPU)", "; ".join(cells), f"{short_device(peers['device'])}, {peers['date']}",
                 "docs/throughput/README.md"))
    prof = {case: profile_kinds(DOCS / "throughput" / f)[1] for case, f in peers["profiles"].items()}
    rows.append(("Memory-bound GPU time of a 370m step (Inductor's kernels, eager element-wise, copies; profiled)",
                 "; ".join(f"{NAMES[c]} {sum(ks.get(k, 0) for k in MEMORY_BOUND):.1f} ms" for c, ks in prof.items()),
                 f"{short_device(peers['device'])}, {peers['date']}", "docs/throughput/README.md"))
    dv = load(GLA_DV)  # call F: FLA's own chunk_gla and the repo's value gradient, alternating on one GPU
    ms = {True: [], False: []}  # FLA's kernel or not: each run's step
    for run in (r for r in dv["runs"] if r["call"].startswith("F")):
        ms[run["label"].startswith("DUALITY_GLA_DV=fla")] += [r["ms"] for r in run["rows"]]
    fla_ms, ours_ms = sum(ms[True]) / len(ms[True]), sum(ms[False]) / len(ms[False])
    rows.append(("GLA backward's value gradient on tensor cores (`kernels/recurrences/gla_dv.py`, the default), "
                 "370m/4096",
                 f"{fla_ms - ours_ms:.1f} ms ({1 - ours_ms / fla_ms:.1%}) off GLA's compiled step ({ours_ms:.1f} "
                 f"against {fla_ms:.1f} ms with FLA's own kernel), the same memory: "
                 f"{gpu[2]['fla:gla'] / ours_ms:.2f}× FLA's `GLAForCausalLM` (measured in an earlier call)",
                 f"H200, {dv['date']}", "docs/throughput/levers.md"))
    qs = list(map(load, QUACK_SWIGLU))
    pairs = quack_pairs()
    gains = [(case, 1 - q["ms"] / i["ms"], q["peak_mem_gib"] - i["peak_mem_gib"]) for _, case, i, q in pairs]
    firsts = [q["first_step_s"] for *_, q in pairs]
    v = load(QUACK_PARITY)["verdict"]["quack"]
    ve = load(EAGER_PARITY)["verdict"]["eager"]  # the same math, other roundings: the protocol's noise
    rows.append(("SwiGLU in quack-kernels' GEMM epilogues (`model.mlp_impl=quack`, opt-in), 370m/4096, compiled",
                 ", ".join(f"{NAMES[c]} {g:.1%}" for c, g, _ in gains) + " faster a step, "
                 f"{'–'.join(dict.fromkeys(f'{m:.1f}' for m in sorted(m for *_, m in gains)))} GiB more memory; "
                 f"a first step of {min(firsts):.0f}–{max(firsts):.0f} s once a machine (its GEMMs compiled); "
                 f"validation loss after 2,000 steps {v['final_paired_diff']:+.3f} against Inductor's "
                 f"({v['worse_final']} seeds higher, inside the seeds' spread of {v['final_bf16_spread']:.2f}; "
                 f"eager against compiled, the same math, {ve['final_paired_diff']:+.3f}, {ve['worse_final']} higher)",
                 f"H200, {qs[0]['date']}/{qs[-1]['date'][-2:]}", "docs/throughput/levers.md"))
    lk = load(LOSS_KERNEL)
    ways = {r["way"]: r for r in lk["loss"][0]["rows"]}
    saved = [c["peak_mem_gib"] - t["peak_mem_gib"] for c, t in _pairs(lk["steps"], "case", "impl",
                                                                      ("chunked", "triton")).values()]
    rows.append(("The loss's Triton kernel (370m: 32,768 tokens, vocabulary 32k, forward + backward)",
                 f"{ways['triton']['ms']:.1f} ms against {ways['chunked']['ms']:.1f} chunked and "
                 f"{ways['logits']['ms']:.1f} full logits (compiled); "
                 f"{'–'.join(dict.fromkeys(f'{x:.1f}' for x in (min(saved), max(saved))))} GiB less peak memory a "
                 f"training step ({len(saved)} backbones)", f"{short_device(lk['device'])}, {lk['date']}",
                 "docs/throughput/README.md"))
    f8 = load(FLOAT8)
    by = {r["case"]: r for r in f8["rows"]}
    bf16, tw = by["transformer+rope"], by["transformer+rope:float8-tensorwise"]
    rows.append(("float8 training (torchao, tensorwise) of the 1.3B transformer + RoPE's Linear layers",
                 f"{bf16['ms'] / tw['ms']:.2f}× bf16's step ({tw['ms']:.0f} against {bf16['ms']:.0f} ms, MFU "
                 f"{tw['mfu']:.2f}); train.float8, opt-in",
                 f"{short_device(f8['device'])}, {f8['date']}", "docs/throughput/levers.md"))
    fp = load(FLOAT8_PARITY)
    (recipe, v), = fp["verdict"].items()
    rows.append(("float8's validation loss against bf16's, 1.3B, 2,000 steps, 2 seeds each",
                 f"{v['mean_paired_diff_late']:+.3f} behind its bf16 twin ({v['positive_late']} evaluations of the "
                 f"second half), bf16's seeds {v['mean_bf16_spread_late']:.3f} apart: a small systematic cost",
                 f"{short_device(fp['device'])}, {fp['date']}", "docs/throughput/levers.md"))
    lg = load(LONGEST)
    mems = [r["peak_mem_gib"] for r in lg["rows"]]
    rows.append(("One 65,536-token sequence at 370m (full checkpointing, chunked loss)",
                 f"{len(mems)} backbones in {min(mems):.1f}–{max(mems):.1f} GiB",
                 f"{short_device(lg['device'])}, {lg['date']}", "docs/memory/README.md"))
    # the latest only (whole-model compilation on H100 / H200 and block by block on an H100: docs/gpu/README.md)
    for path, how in ((FIRST_STEP_H200_FRESH, "compiled block by block, the default"),):
        fs = load(path)
        firsts = [r["first_step_s"] for r in fs["rows"]]
        rows.append((f"First compiled step of a fresh process, shipped kernel configs (370m/4096, {how})",
                     f"{min(firsts):.0f}–{max(firsts):.0f} s over {len(firsts)} cases, "
                     f"{sum(r['configs_timed'] for r in fs['rows'])} configs timed",
                     f"{short_device(rows_device(fs))}, {rows_date(fs)}", "docs/gpu/README.md"))
    gt = load(GPU_TEST_H200)
    last = gt["runs"][0]  # the whole group (later runs are subsets)
    rows.append(("`make gpu-test` on a bare machine (the GPU group)",
                 f"{last['passed']} passed, {last['failed']} failed, {last['skipped']} skipped in "
                 f"{last['pytest_s']:.0f} s", f"{short_device(gt['device'])}, {gt['date']}", "docs/gpu/README.md"))
    lm = load(LM_EVAL_BENCH[-1])
    graphed = [r["graphed_req_s"] / r["adapter_req_s"] for r in lm["rows"]]
    rates = [r["graphed_req_s"] for r in lm["rows"]]
    rows.append((f"lm-eval loglikelihood scoring, {lm['size']} at batch 16 and 64 (the default scorer, CUDA graphs, "
                 "against the old adapter)", f"{min(graphed):.1f}–{max(graphed):.1f}× its requests/s "
                 f"({min(rates):,.0f}–{max(rates):,.0f}), scores equal to the eager scorer's",
                 f"{short_device(lm['device'])}, {lm['date']}", "docs/evaluation.md"))
    mg = load(MULTI_GPU)
    ddp, fsdp = mg["scaling"]["scale_gpu2_ddp"], mg["scaling"]["scale_gpu2_fsdp"]
    rows.append(("2 GPUs against 1, 124m (DDP / FSDP2)",
                 f"{ddp['speedup']:.2f}× / {fsdp['speedup']:.2f}×; fp32 losses within "
                 f"{max(r['max_abs_loss_diff'] for r in mg['fp32'].values()):.0e}",
                 f"{short_device(mg['device'])}, {mg['date']}", "docs/multi_gpu/README.md"))
    s4 = load(SCALING_4)
    ddp4, fsdp4 = s4["runs"]["scale_gpu4_ddp"], s4["runs"]["scale_gpu4_fsdp"]
    rows.append(("4 GPUs against 1, 124m (DDP / FSDP2)", f"{ddp4['speedup']:.2f}× / {fsdp4['speedup']:.2f}×; FSDP2 at "
                 f"{fsdp4['x_ddp']:.0%} of DDP", f"{short_device(s4['device'])}, {s4['date']}",
                 "docs/multi_gpu/README.md"))
    fp = load(FSDP2_PROFILE)
    rows.append(("FSDP2 against DDP on 4 GPUs, 124m, profiled at steady state",
                 f"{fp['ratio']:.0%} of DDP's tokens/s; {fp['profile']['fsdp']['nccl_exposed_ms']:.1f} ms a step of "
                 f"communication with no compute beside it, against {fp['profile']['ddp']['nccl_exposed_ms']:.1f}",
                 f"{short_device(fp['device'])}, {fp['date']}",
                 "docs/multi_gpu/README.md"))
    fp2 = load(FSDP2_PROFILE_2)
    last = fp2["calls"][-1]  # the call that logged every 5 steps: three clean windows
    rows.append(("FSDP2 against DDP on 2 GPUs, 124m (parameters gathered in fp32 / bf16)",
                 f"{last['ratio']:.0%} / {last['ratio_bf16']:.0%} of DDP's tokens/s",
                 f"{short_device(fp2['device'])}, {fp2['date']}", "docs/multi_gpu/README.md"))
    fp4_rec = load(FSDP2_PROFILE_4_BF16)
    fp4 = fp4_rec["calls"][-1]
    rows.append(("FSDP2 against DDP on 4 GPUs, 124m (parameters gathered in fp32 / bf16)",
                 f"{fp4['ratio']:.1%} / {fp4['ratio_bf16']:.1%} of DDP's tokens/s; "
                 f"{fp4['profile']['fsdp_bf16']['nccl_exposed_ms']:.0f} ms a step of exposed communication either way",
                 f"{short_device(fp4_rec['device'])}, {fp4_rec['date']}", "docs/multi_gpu/README.md"))
    pf_rec = load(FSDP2_PREFETCH)
    pf = pf_rec["calls"][-1]["ratio"]
    rows.append(("FSDP2 against DDP on 4 GPUs, 124m (own order / prefetching 1 block, the default / 2 blocks)",
                 f"{pf['fsdp']:.1%} / {pf['fsdp_prefetch1']:.1%} / {pf['fsdp_prefetch2']:.1%} of DDP's tokens/s",
                 f"{short_device(pf_rec['device'])}, {pf_rec['date']}", "docs/multi_gpu/README.md"))
    sc_rec = load(SCALE_4)
    sc = sc_rec["throughput"]
    rows.append(("1 → 2 → 4 GPUs at a fixed batch a GPU, 370m/4096 transformer + RoPE (DDP / FSDP2)",
                 ", ".join(f"{n} GPUs " + " / ".join(f"{sc[c][n]['efficiency']:.0%}" for c in
                                                      ("370m_transformer_ddp", "370m_transformer_fsdp"))
                           for n in ("2", "4")) + " of linear scaling",
                 f"{short_device(sc_rec['device'])}, {sc_rec['date']}", "docs/multi_gpu/README.md"))
    sc_rec = load(SCALE_4C)
    sc = sc_rec["throughput"]
    eff = {c: f"{sc[c]['4']['efficiency']:.0%}" for c in sc if c.startswith("370m")}
    of_ddp = {b: f"{sc[f'370m_{b}_fsdp']['4']['tokens_per_s'] / sc[f'370m_{b}_ddp']['4']['tokens_per_s']:.0%}"
              for b in ("gla", "gated_deltanet")}
    rows.append(("1 → 2 → 4 GPUs at a fixed batch a GPU, 370m/4096 GLA and Gated DeltaNet (DDP / FSDP2)",
                 f"4 GPUs: GLA {eff['370m_gla_ddp']} / {eff['370m_gla_fsdp']}, Gated DeltaNet "
                 f"{eff['370m_gated_deltanet_ddp']} / {eff['370m_gated_deltanet_fsdp']} of linear scaling (FSDP2 at "
                 f"{of_ddp['gla']} / {of_ddp['gated_deltanet']} of DDP's tokens/s)",
                 f"{short_device(sc_rec['device'])}, {sc_rec['date']}", "docs/multi_gpu/README.md"))
    se_rec = load(SCALE_4E)
    se = se_rec["throughput"]["1_3b_gla_fsdp"]
    rows.append(("1 → 2 → 4 GPUs at a fixed batch a GPU, 1.3B GLA (FSDP2, full activation checkpointing)",
                 f"{se['4']['tokens_per_s']:,.0f} tokens/s on 4 GPUs, "
                 f"{se['4']['tokens_per_s'] / se['1']['tokens_per_s']:.2f}× one; {se['2']['efficiency']:.0%} / "
                 f"{se['4']['efficiency']:.0%} of linear scaling on 2 / 4",
                 f"{short_device(se_rec['device'])}, {se_rec['date']}", "docs/multi_gpu/README.md"))
    sb_rec = load(SCALE_4B)
    walls = {s["gpus"]: s["wall_s"] for s in sb_rec["sweep"]}
    rows.append(("Seed 004's S2 sweep (6 jobs, one epoch each) dealt over 4 GPUs against 1 (`hydra/launcher=gpus`)",
                 f"{walls[1] / walls[4]:.2f}× ({walls[4]} s against {walls[1]} s)",
                 f"{short_device(sb_rec['device'])}, {sb_rec['date']}", "docs/multi_gpu/README.md"))
    cp = [s for s in load(CP_LONGEST[-1])["summary"] if s["case"] == "gla+nope"]
    one, most = cp[0], cp[-1]
    cp_rec = load(CP_LONGEST[-1])
    rows.append((f"One 370m GLA sequence split over {most['gpus']} GPUs (context parallelism)",
                 f"{most['longest']['seq_len']:,} tokens, {most['x_one_gpu']:.2f}× one GPU's longest, "
                 f"{most['longest']['tokens_per_s'] / one['longest']['tokens_per_s']:.2f}× its tokens/s",
                 f"{most['gpus']} × {short_device(cp_rec['device'])}, {cp_rec['date']}", "docs/multi_gpu/README.md"))
    speed, mem2, mem1 = fsdp_1_3b()
    f13 = load(FSDP_1_3B)
    rows.append(("1.3B under FSDP2, 2 GPUs against 1", f"{speed:.2f}×, {mem2:.1f} GiB a GPU against {mem1:.1f}",
                 f"{short_device(f13['device'])}, {f13['date']}", "docs/multi_gpu/README.md"))
    fla = {(r["case"], r["batch"]): r for r in load(DECODE_FLA)["rows"]}
    grid = {(r["case"], r["batch"], r["prompt"]): r for r in load(DECODE[-2])["rows"]}  # the latest grid
    compiled = {(r["case"], r["batch"], r["prompt"]): r for r in load(DECODE[-1])["rows"]}
    dec_rec = load(DECODE[-2])
    rows.append(("Greedy decoding, 370m, bf16, 512-token prompt (`generate`; GLA against FLA's `GLAForCausalLM`)",
                 f"GLA {grid[('gla', 1, 512)]['tokens_per_s']:,.0f} tokens/s at batch 1 "
                 f"({compiled[('gla (compiled step)', 1, 512)]['tokens_per_s']:,.0f} with a compiled step), "
                 f"{grid[('gla', 32, 512)]['tokens_per_s']:,.0f} at batch 32; "
                 + " / ".join(f"{fla[('fla:gla', b)]['ms_per_token'] / fla[('gla', b)]['ms_per_token']:.1f}×"
                              for b in (1, 32)) + " FLA's speed at batch 1 / 32",
                 f"{short_device(dec_rec['device'])}, {dec_rec['date']}", "docs/inference.md"))
    lines = ["| measured | result | measured on | page |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {link(d)} |" for a, b, c, d in rows]
    return "\n".join(lines)


def decode_table() -> str:
    """Every decoding measurement (benchmarks/bench_decode.py's records): ms a new token, tokens/s, prefill time and
    peak memory by case, batch and prompt length."""
    lines = ["| case | batch | prompt | ms / token | tokens/s | prefill ms | peak GiB | commit | record |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for path in DECODE:
        rec = load(path)
        for r in rec["rows"]:
            cells = (["does not fit in memory", "", "", ""] if r.get("oom") else
                     [f"{r['ms_per_token']:.2f}", f"{r['tokens_per_s']:,.0f}", f"{r['prefill_ms']:,.0f}",
                      f"{r['peak_gib']:.1f}"])
            lines.append(f"| {r['case']} | {r['batch']} | {r['prompt']:,} | " + " | ".join(cells)
                         + f" | {rec['commit']} | {link(rel(path), path.name)} |")
    return "\n".join(lines)


def test_time() -> str:
    """make test's time from the newest clean-clone record without a failure (CI's machine, 2 cores)."""
    rec = load(CLEAN_CLONE)
    r = [r for r in rec["runs"] if not r.get("failed")][-1]
    return (f"`make test` on a clean clone of main took {r['pytest_s'] / 60:.0f} minutes of tests ({r['passed']:,} "
            f"passed) on CI's kind of machine (2 cores), {r['date']} at {r['commit']}; "
            f"{link(rel(CLEAN_CLONE), 'record')}")


def retrieval_table() -> str:
    """The retrieval study's record: each model's steps in its budget, then string match (teacher-forced greedy
    share) by context length over every family, and the evaluation's seconds."""
    rec = load(RETRIEVAL)
    lengths = sorted({int(L) for r in rec["runs"].values() for L in r["summary"]["by_length"]})
    k = lambda n: f"{n // 1024}k" if n >= 1024 else str(n)  # noqa: E731
    lines = ["| model (trained at 512) | steps | " + " | ".join(k(L) for L in lengths) + " | eval s |",
             "|---|---:|" + "---:|" * len(lengths) + "---:|"]
    for r in rec["runs"].values():
        cells = [f"{c['string_match']:.2f} ({c['greedy']:.2f})" for c in
                 (r["summary"]["by_length"][str(L)] for L in lengths)]
        lines.append(f"| {r['label'].split(' (')[0]} | {r['steps']:,} | " + " | ".join(cells)
                     + f" | {r['eval_seconds']:.0f} |")
    source = f"{short_device(rec['device'])}, {rec['date']}, {rec['commit']}; {link(rel(RETRIEVAL), 'record')}"
    return "\n".join(lines) + "\n\n" + source


def verdicts_table() -> str:
    """Seed 004's claims: the verdicts written in docs/synthetic/verdicts.json (against the paper, and against the
    seed's own code run here), the date and device of the claim's record."""
    lines = ["| claim | reproduces the paper | reproduces the seed's code | measured on | page |",
             "|---|---|---|---|---|"]
    for v in load(VERDICTS)["claims"]:
        rec = load(DOCS / "synthetic" / v["record"])
        date = rec.get("date") or re.search(r"\d{4}-\d\d-\d\d", v["record"]).group(0)  # older records: the name's
        against_code = v["seed_code"] + (f" ({link('docs/synthetic/' + v['seed_code_anchor'], 'A/B')})"
                                         if "seed_code_anchor" in v else "")
        lines.append(f"| {v['claim']} | {v['verdict']} | {against_code} | {short_device(rec['device'])}, {date} | "
                     f"{link('docs/synthetic/' + v.get('anchor', 'README.md'))} |")
    return "\n".join(lines)


BLOCKS = {"summary": summary_table, "verdicts": verdicts_table, "throughput": throughput_table, "decode": decode_table,
          "retrieval": retrieval_table, "test_time": test_time,
          "activation_checkpointing": activation_checkpointing_table, "mqar_seeds": mqar_seeds_table,
          "vs_fla": vs_fla_table, "first_step": first_step_table,
          "first_step_h200": lambda: first_step_table(FIRST_STEP_H200), "compile_scope": compile_scope_table,
          "first_step_blocks": lambda: first_step_table(FIRST_STEP_BLOCKS),
          "first_step_h200_blocks": lambda: first_step_table(FIRST_STEP_H200_BLOCKS),
          "first_step_h200_fresh": lambda: first_step_table(FIRST_STEP_H200_FRESH), "loss_kernel": loss_kernel_table,
          "quack_swiglu": quack_swiglu_table, "gla_qkv": lambda: runs_table(GLA_QKV),
          "qkv_others": lambda: runs_table(QKV_OTHERS),
          "gla_levers": lambda: runs_table(GLA_LEVERS), "gla_dv": lambda: runs_table(GLA_DV), "float8": float8_table,
          "gdn_v": lambda: runs_table(GDN_V), "peers_h200": lambda: runs_table(PEERS_H200),
          "profiles_h200": profiles_table,
          "float8_parity": lambda: parity_table(FLOAT8_PARITY),
          "quack_parity": lambda: parity_table(QUACK_PARITY, "inductor"),
          "eager_parity": lambda: parity_table(EAGER_PARITY, "compiled"), "mlp_numerics": mlp_numerics_table,
          "lm_eval_bench": lm_eval_bench_table,
          "longest": longest_table,
          "multi_gpu": multi_gpu_table, "official_ab": official_ab_table,
          "official_ab_fits": official_ab_fits_table, "official_ab_copying": official_ab_copying_table,
          "official_ab_copying_steps": official_ab_copying_steps_table, "dcp": dcp_table,
          "cp_longest": cp_longest_table,
          "scaling_4": scaling_4_table, "fsdp2_2xh200": lambda: fsdp2_calls_table(FSDP2_PROFILE_2),
          "fsdp2_4xh200_bf16": lambda: fsdp2_calls_table(FSDP2_PROFILE_4_BF16),
          "fsdp2_prefetch_4xh200": lambda: fsdp2_calls_table(FSDP2_PREFETCH),
          "scale_4xh200": lambda: scale_table(SCALE_4), "sweep_s2": sweep_table,
          "scale_4xh200_b": lambda: scale_table(SCALE_4B), "scale_4xh200_c": lambda: scale_table(SCALE_4C),
          "scale_1xh200_d": lambda: scale_table(SCALE_1D), "scale_4xh200_e": lambda: scale_table(SCALE_4E),
          "results_summary": lambda: "\n".join(f"- {line}" for line in (results.mqar_summary(), results.s2_summary()
                                                                         + results.negeig_summary(),
                                                                         results.retrieval_summary())),
          "results_duality": results.duality_table,
          "results_rerun": results.rerun_summary, "results_status": results.status_table,
          **{f"results_{t}": (lambda t=t: results.table(t)) for t in results.TASKS},
          "results_sessions": lambda: "\n\n".join(results.sessions_table(t) for t in results.TASKS)}
MARK = re.compile(r"(<!-- report:(\w+) -->\n)(.*?)(<!-- /report:\2 -->)", re.S)


def render(text: str, page: Path) -> str:
    """`text` with every generated block redrawn (links in README-relative form made relative to `page`)."""
    def sub(m):
        name = m.group(2)
        if name not in BLOCKS:
            raise KeyError(f"{page.name}: no generator for block {name!r}; known: {sorted(BLOCKS)}")
        body = BLOCKS[name]()
        if page.parent != ROOT:  # the blocks link README-relative; a page under docs/ links from where it is
            body = re.sub(r"\]\(docs/([^)]*)\)",
                          lambda x: f"]({os.path.relpath(ROOT / 'docs' / x.group(1), page.parent)})", body)
        return f"{m.group(1)}{body}\n{m.group(4)}"
    return MARK.sub(sub, text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 if a block is out of date")
    a = p.parse_args(argv)
    stale = []
    for page in PAGES:
        old = page.read_text()
        new = render(old, page)
        if new != old:
            stale.append(rel(page))
            if not a.check:
                page.write_text(new)
    if a.check and stale:
        print("out of date with their records (run python scripts/report.py):", ", ".join(stale))
        return 1
    print(("rewrote: " + ", ".join(stale)) if stale and not a.check else "every generated block is up to date")
    if not a.check:  # the results page's heatmaps, always (PNG bytes vary with matplotlib: --check reads the tables)
        drawn = [rel(results.plot(task)) for task in results.TASKS if results.load(task) is not None]
        if drawn:
            print("drew: " + ", ".join(drawn))
    return 0


if __name__ == "__main__":
    sys.exit(main())
