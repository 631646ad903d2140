"""Throughput of the lm-eval adapter's batched scoring: loglikelihood requests per second at several batch sizes.

The requests are the harness's own for evals/local_tasks/pydoc_mc (each example = 4 (context, choice) requests),
scored by DualityLM.loglikelihood exactly as simple_evaluate would call it; generation is timed on pydoc_complete.

    python scripts/bench_lm_eval.py CKPT [CKPT ...] [--batch-sizes 1 16 64]
    python scripts/bench_lm_eval.py --fresh transformer/rope gla/nope --size 124m   # models at init, byte tokens
    ... --cudnn      # let SDPA use cuDNN, which builds a plan per new shape (the adapter turns it off)
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class Req:
    def __init__(self, *args):
        self.args = args


def main():
    from trainer.checkpoint import load_model
    from evals.harness import DualityLM
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpts", nargs="*")
    ap.add_argument("--fresh", nargs="*", default=[], help="backbone/pe models at init instead of checkpoints")
    ap.add_argument("--size", default="124m")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--cudnn", action="store_true")
    args = ap.parse_args()
    if args.cudnn:
        import contextlib

        import evals.harness
        import model.gpt
        evals.harness.varying_shapes = model.gpt.varying_shapes = contextlib.nullcontext
    docs = [json.loads(line) for line in open(ROOT / "evals/local_tasks/pydoc_mc.jsonl")]
    reqs = [Req(d["context"], c) for d in docs for c in d["choices"]]
    gen_docs = [json.loads(line) for line in open(ROOT / "evals/local_tasks/pydoc_complete.jsonl")]
    gens = [Req(d["context"], {"until": ["."], "max_gen_toks": 16}) for d in gen_docs]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}; {len(docs)} examples = "
          f"{len(reqs)} loglikelihood requests; {len(gens)} generate_until requests (16 new tokens at most)")
    print(f"SDPA cuDNN backend: {'allowed' if args.cudnn else 'off'}")
    print("| model | batch | loglikelihood requests/s | examples/s | generate_until requests/s |")
    print("|---|---|---|---|---|")
    from data import Tokenizer
    from eval import fresh_models
    models = [(f"{c['config']['backbone']['name']} + {c['config']['pe']['name']}", m, tok)
              for m, tok, c in (load_model(ck, device) for ck in args.ckpts)]
    models += [(n, m, Tokenizer("byte")) for n, m in fresh_models(args.fresh, device, args.size, vocab=257)]
    for name, model, tok in models:
        for bs in args.batch_sizes:
            lm = DualityLM(model, tok, batch_size=bs, device=device, progress=False)
            lm.loglikelihood(reqs[:4 * bs])  # warm-up (kernels, autotuning)
            sync()
            t = time.perf_counter()
            lm.loglikelihood(reqs)
            sync()
            ll = len(reqs) / (time.perf_counter() - t)
            t = time.perf_counter()
            lm.generate_until(gens)
            sync()
            g = len(gens) / (time.perf_counter() - t)
            print(f"| {name} | {bs} | {ll:,.0f} | {ll / 4:,.0f} | {g:,.1f} |", flush=True)


if __name__ == "__main__":
    main()
