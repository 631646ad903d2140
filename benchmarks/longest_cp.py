"""The longest sequence that trains one step on N GPUs, each holding 1/N of it (train.context_parallel=N).

    torchrun --nproc_per_node=N benchmarks/longest_cp.py --case gla+nope --size 370m --out OUT/longest_cp.jsonl
    python benchmarks/longest_cp.py --report OUT/longest_cp.jsonl [--record docs/multi_gpu/cp_longest_h100.json]

A step is train.py's (`train_step`): forward, backward, gradient clipping, fused AdamW, bf16 autocast, one sequence
of random tokens (the same on every rank for a length: seeded), each rank its contiguous slice, the model called with
the group as train.py calls it (`cp_group`); DDP over the group sums the gradients. With --set the model is
configured like the one-GPU record (docs/memory, `longest`): full activation checkpointing and the chunked loss.
With --documents M the sequence packs documents of random lengths (mean M, seeded: the same on every rank), as
train.doc_boundaries does: each rank gets the boundaries as its slice sees them, so documents cross the slices.

Lengths are tried in ascending order (--lengths, or multiples of 65,536 that split evenly): --steps steps after one
warm-up, then the next. The first length that runs out of memory ends the process (the rank writes an `oom` row and
exits; torchrun stops the others), so the longest that trains is the last row before it. A collective cannot be
abandoned by one rank, so a longer length is never tried after an OOM in the same process. Rows are appended to
--out as they come (a cut run keeps what it measured). --report writes the record (JSON), a table (Markdown) and a
figure (PNG) beside the rows: the longest per case and GPU count, its ratio to one GPU, tokens/s at 65,536 and at the
longest, and how far the first step's loss is from one GPU's (the shortest length, tried first: the same tokens and
initial weights on every GPU count, so equal up to bf16 rounding; later lengths start from weights that AdamW's first
steps moved, which amplify rounding, so they are not compared).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_train import SETTINGS, build  # noqa: E402

UNIT = 65536


def lengths_for(world: int, top: int) -> list[int]:
    """65,536, then multiples of 65,536 x world up to top (each splits into `world` equal slices)."""
    out = [UNIT] + [UNIT * world * k for k in range(1, top // (UNIT * world) + 1)]
    return sorted(set(x for x in out if x % world == 0))


def run(args) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from duality.trainer.optim import make_optimizer, train_step
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()  # on a CPU (gloo) at tiny sizes: how tests/test_longest_cp.py runs it
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    lengths = args.lengths or lengths_for(world, args.max_len)
    bad = [n for n in lengths if n % world]
    if bad:
        raise SystemExit(f"--lengths {bad} do not split into {world} equal slices")
    model_name, _, vocab = SETTINGS.get(args.size, (args.size, 0, 32000))
    torch.manual_seed(0)
    model, optim_cfg, _ = build(args.case, model_name, max(lengths), vocab, args.set)
    model = model.to(device)
    # as trainer/runtime.py wraps it: gradients in the all-reduce buckets (one fp32 copy, not two), no buffer broadcast
    train_model = (DDP(model, device_ids=[local] if cuda else None, gradient_as_bucket_view=True,
                       broadcast_buffers=False) if world > 1 else model)
    optimizer = make_optimizer(model, optim_cfg, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    from duality.kernels.varlen import slice_boundaries
    case = args.case + (f" docs {args.documents}" if args.documents else "")
    gpu = torch.cuda.get_device_name(device) if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda d: None)
    for n in lengths:
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        tokens = torch.randint(0, vocab, (1, n + 1), generator=torch.Generator().manual_seed(n))
        piece = n // world
        x = tokens[:, rank * piece:(rank + 1) * piece].to(device)
        y = tokens[:, rank * piece + 1:(rank + 1) * piece + 1].to(device)
        kw = {"cp_group": dist.group.WORLD} if world > 1 else {}
        if args.documents:  # lengths 1 .. 2M - 1, the last cut at n
            lengths_n = torch.randint(1, 2 * args.documents, (n // args.documents + 1,),
                                      generator=torch.Generator().manual_seed(n + 1))
            cu = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths_n, 0)])
            cu = torch.cat([cu[cu < n], torch.tensor([n])])
            kw["cu_seqlens"] = (slice_boundaries(cu, rank * piece, piece) if world > 1 else cu).to(device)
        row = {"case": case, "size": args.size, "gpus": world, "seq_len": n, "device": gpu,
               "torch": torch.__version__, "set": list(args.set), "documents": args.documents}
        try:
            times = []
            for i in range(1 + args.steps):  # steps of seconds: a sync after each costs nothing measurable
                t0 = time.perf_counter()
                loss, _, _ = train_step(train_model, [(x, y, kw)], 1, optimizer, scheduler, autocast, 1.0)
                sync(device)
                times.append(time.perf_counter() - t0)
                if i == 0:
                    first = float(loss)  # the loss of the first step: the same weights and tokens on every count
        except torch.OutOfMemoryError:
            row.update(oom=True, rank=rank)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{case} on {world}: {n:,} tokens ran out of memory on rank {rank}", flush=True)
            os._exit(3)  # torchrun stops the other ranks, which wait in a collective
        ms = sorted(times[1:])[(len(times) - 1) // 2] * 1e3  # the median past the warm-up
        peak = torch.tensor(torch.cuda.max_memory_allocated(device) / 2 ** 30 if cuda else 0.0, device=device)
        if world > 1:
            dist.all_reduce(peak, dist.ReduceOp.MAX)
            loss_all = torch.tensor(first, device=device)
            dist.all_reduce(loss_all)
            first = float(loss_all) / world  # equal slices: the mean of the ranks' means is the sequence's mean
        row.update(ms=ms, tokens_per_s=n / ms * 1e3, peak_mem_gib=float(peak), loss=first, first_step_s=times[0],
                   total_mem_gib=torch.cuda.get_device_properties(device).total_memory / 2 ** 30 if cuda else None)
        if rank == 0 and n == lengths[0]:  # what this GPU autotuned (DUALITY_TUNE_OUT): kernels/configs/<GPU>
            from duality.kernels.tuned_configs import dump_requested
            dump_requested(f"longest_{args.case}_{world}")
        if rank == 0:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{case} on {world}: {n:>9,} tokens  {ms:9.1f} ms  {row['tokens_per_s']:9.0f} tok/s  "
                  f"peak {row['peak_mem_gib']:5.1f} GiB  loss {first:.4f}", flush=True)
    if world > 1:
        dist.destroy_process_group()


def summarise(rows: list[dict]) -> list[dict]:
    """One row per (case, gpus): the longest length that trained, and the first that did not."""
    out = {}
    for r in rows:
        s = out.setdefault((r["case"], r["gpus"]), {"case": r["case"], "size": r["size"], "gpus": r["gpus"],
                                                     "longest": None, "oom_at": None, "device": r["device"]})
        if r.get("oom"):
            s["oom_at"] = min(s["oom_at"] or r["seq_len"], r["seq_len"])
        elif s["longest"] is None or r["seq_len"] > s["longest"]["seq_len"]:
            s["longest"] = r
        if not r.get("oom") and r["seq_len"] == UNIT:
            s["at_65536"] = r
        if not r.get("oom") and ("first" not in s or r["seq_len"] < s["first"]["seq_len"]):
            s["first"] = r  # the shortest length, tried first: its first step starts from the initial weights
    for s in out.values():
        one = out.get((s["case"], 1))
        s["x_one_gpu"] = (s["longest"]["seq_len"] / one["longest"]["seq_len"]
                          if one and one["longest"] and s["longest"] else None)
        base, first = (one or {}).get("first"), s.get("first")
        same = base and first and base["seq_len"] == first["seq_len"]
        s["loss_diff_first"] = abs(first["loss"] - base["loss"]) if same else None
    return sorted(out.values(), key=lambda s: (s["case"], s["gpus"]))


def table(summary: list[dict]) -> str:
    lines = ["| case | GPUs | longest that trains (tokens) | x 1 GPU | first OOM | tokens/s at the longest | peak GiB "
             "| tokens/s at 65,536 | first loss vs 1 GPU |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        lg, at = s["longest"] or {}, s.get("at_65536") or {}
        cell = (lambda v, f: format(v, f) if v is not None else "–")
        bound = "" if s["oom_at"] else "≥ "  # no length ran out of memory: the run stopped before the limit
        lines.append(f"| {s['case']} {s['size']} | {s['gpus']} | {bound}{cell(lg.get('seq_len'), ',')} | "
                     f"{cell(s['x_one_gpu'], '.2f')} | {cell(s['oom_at'], ',')} | "
                     f"{cell(lg.get('tokens_per_s'), ',.0f')} | {cell(lg.get('peak_mem_gib'), '.1f')} | "
                     f"{cell(at.get('tokens_per_s'), ',.0f')} | {cell(s['loss_diff_first'], '.1e')} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    from duality.common.plots import save_figure

    def draw(axes):
        a, b = axes
        for case, gpus in sorted({(r["case"], r["gpus"]) for r in rows}):
            ok = sorted((r for r in rows if r["case"] == case and r["gpus"] == gpus and not r.get("oom")),
                        key=lambda r: r["seq_len"])
            label = f"{case}, {gpus} GPU{'s' if gpus > 1 else ''}"
            a.plot([r["seq_len"] for r in ok], [r["peak_mem_gib"] for r in ok], "o-", label=label)
            b.plot([r["seq_len"] for r in ok], [r["tokens_per_s"] for r in ok], "o-", label=label)
        total = max((r.get("total_mem_gib") or 0) for r in rows)
        if total:
            a.axhline(total, color="grey", ls=":", label="GPU memory")
        for ax, name in ((a, "peak memory a GPU (GiB)"), (b, "tokens/s (the group)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length (tokens, one sequence a step)")
            ax.set_ylabel(name)
            ax.grid(alpha=0.3)
        a.legend(fontsize=7)
        a.set_title("memory: one sequence split over N GPUs", fontsize=9)
        b.set_title("throughput", fontsize=9)

    save_figure(path, draw, figsize=(11, 4), ncols=2)


def report(path: Path, record: Path | None, command: str, date: str) -> None:
    from duality.common.io import write_atomic
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    summary = summarise(rows)
    record = record or path.with_suffix(".json")
    write_atomic(record, json.dumps({"date": date, "command": command, "device": rows[0]["device"],
                                     "torch": rows[0]["torch"], "summary": summary, "rows": rows}, indent=1))
    write_atomic(record.with_suffix(".md"), table(summary) + "\n")
    plot(rows, record.with_suffix(".png"))
    print(table(summary))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", default="gla+nope")
    p.add_argument("--size", default="370m", help="conf/model/SIZE.yaml (124m, 370m, 1_3b: bench_train's vocabulary)")
    p.add_argument("--lengths", type=int, nargs="*", help="ascending; default: 65,536 then multiples of 65,536 x N")
    p.add_argument("--max-len", type=int, default=4 * 2 ** 20, help="the longest length tried by default")
    p.add_argument("--steps", type=int, default=2, help="timed steps a length, after one warm-up")
    p.add_argument("--documents", type=int, default=0, help="pack documents of this mean length (0: one sequence)")
    p.add_argument("--set", nargs="*", default=["train.activation_checkpointing=full", "model.fused_loss=true"])
    p.add_argument("--out", type=Path, help="rows (JSON lines), appended")
    p.add_argument("--report", type=Path, help="rows to report instead of running")
    p.add_argument("--record", type=Path)
    p.add_argument("--command", default="", help="the command that measured the rows, for the record")
    p.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    args = p.parse_args(argv)
    if args.report:
        return report(args.report, args.record, args.command, args.date)
    if not args.out:
        p.error("--out is needed to run")
    if args.lengths and sorted(args.lengths) != args.lengths:
        p.error("--lengths must ascend: an OOM ends the process")
    run(args)


if __name__ == "__main__":
    main()
