"""What `model.sparse_loss` saves on MQAR: one training step (forward + backward) of task=mqar's model with the loss
over every position (`model.fused_loss` alone) and over the scored ones only (`model.sparse_loss`, the task's default).

    python benchmarks/bench_sparse_loss.py                              # d_model 64, (256, 16), 64 rows, CPU or CUDA
    python benchmarks/bench_sparse_loss.py --d-model 128 --batch 512 --device cuda

MQAR scores one position in 16 (the queries' values) against a vocabulary of 8,192, so at d_model 64 the tied head
and its loss are most of the step. Prints the median of --steps steps after one warm-up, and the peak memory on CUDA.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_train import compose  # benchmarks/ is on sys.path when a script runs

from duality.model import build_model


def step_ms(model, idx, tgt, steps: int, device: str) -> float:
    times = []
    for _ in range(steps + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            _, loss = model(idx, tgt)
        loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times[1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--pairs", type=int, default=16, help="scored positions a row (MQAR's key-value pairs)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    task = ["task=mqar", "backbone=gla", "pe=nope", f"model.d_model={args.d_model}", f"data.seq_len={args.seq_len}",
            f"data.num_kv_pairs={args.pairs}"]
    vocab = compose(task).data.vocab_size
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, vocab, (args.batch, args.seq_len), generator=g).to(args.device)
    tgt = torch.full_like(idx, -1)
    tgt[:, args.seq_len // 2::args.seq_len // 2 // args.pairs] = 5  # the query positions of the second half
    print(f"{args.device}, {torch.get_num_threads()} threads, d_model {args.d_model}, {args.batch} x {args.seq_len} "
          f"tokens, {int((tgt >= 0).sum(1)[0])} scored a row")
    for sparse in (False, True):
        torch.manual_seed(0)
        cfg = compose([*task, f"model.sparse_loss={str(sparse).lower()}"])  # task=mqar's model, as train.py builds it
        model = build_model(cfg.backbone, cfg.pe, cfg.model, vocab).to(args.device)
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        ms = step_ms(model, idx, tgt, args.steps, args.device)
        peak = f", peak {torch.cuda.max_memory_allocated() / 2 ** 30:.2f} GiB" if args.device == "cuda" else ""
        print(f"sparse_loss={str(sparse).lower():5s}: {ms:8.1f} ms a step{peak}")


if __name__ == "__main__":
    main()
