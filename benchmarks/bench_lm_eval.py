"""Throughput of lm-eval scoring on this repo's transformers model (hf.py): loglikelihood requests per second through
the harness's own HFLM and through this repo's batched subclass of it (evals/harness.py), with the largest difference
between their scores, at several batch sizes; the batched scorer's rate were its forwards all it did (each timed
alone in one more pass), run eagerly; with --cuda-graphs the same scorer with its trunk replayed from CUDA graphs (its
default on a GPU); and
generate_until requests per second.

The requests are the harness's own for evals/local_tasks/pydoc_mc (each example = 4 (context, choice) requests),
scored by HFLM.loglikelihood exactly as simple_evaluate would call it; generation is timed on pydoc_complete
(at most 16 new tokens, stopping at "."). Needs lm-eval and accelerate, not the datasets stack.

    python benchmarks/bench_lm_eval.py CKPT [CKPT ...] [--batch-sizes 1 16 64]
    python benchmarks/bench_lm_eval.py --fresh transformer/rope gla/nope --size 124m   # models at init, byte tokens
    python benchmarks/bench_lm_eval.py --fresh transformer/rope --size 124m --cuda-graphs  # GPU: + the graphed scorer
"""

import argparse
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def fresh(specs, size: str, device):
    """'backbone/pe' -> (label, DualityForCausalLM at init of conf/model/<size>.yaml, byte tokenizer)."""
    from omegaconf import OmegaConf

    from duality.data import Tokenizer
    from duality.eval import compose_config
    from duality.hf import DualityConfig, DualityForCausalLM, hf_tokenizer
    tok = Tokenizer("byte")
    for spec in specs:
        b, p = spec.split("/")
        cfg = compose_config([f"backbone={b}", f"pe={p}", f"model={size}"])
        c = {g: OmegaConf.to_container(cfg[g], resolve=True) for g in ("backbone", "pe", "model")}
        torch.manual_seed(0)
        config = DualityConfig(**c, vocab_size=tok.vocab_size, eos_token_id=tok.eot_id, pad_token_id=tok.eot_id,
                               bos_token_id=tok.eot_id)
        yield f"{b} + {p}", DualityForCausalLM(config).to(device).eval(), hf_tokenizer(tok)


def forward_seconds(lm, reqs, sync) -> float:
    """The seconds that lm's forwards (its _forward: the model's logits at a batch's scored positions) take in one
    more pass over reqs, each timed alone (synchronised before and after): what the scorer's rate would be with
    nothing but its model calls, to compare with a scorer that runs another model code (the old adapter runs
    bdd4289's)."""
    spent, call = [0.0], lm._forward

    def timed(*args, **kwargs):
        sync()
        t = time.perf_counter()
        out = call(*args, **kwargs)
        sync()
        spent[0] += time.perf_counter() - t
        return out
    lm._forward = timed
    try:
        lm.loglikelihood(reqs, disable_tqdm=True)
    finally:
        del lm._forward
    return spent[0]


def main():
    from lm_eval.api.instance import Instance

    from duality.evals.harness import hflm
    from duality.hf import DualityForCausalLM
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpts", nargs="*")
    ap.add_argument("--fresh", nargs="*", default=[], help="backbone/pe models at init instead of checkpoints")
    ap.add_argument("--size", default="124m")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--no-generate", action="store_true", help="time loglikelihood only")
    ap.add_argument("--cuda-graphs", action="store_true", help="also the batched scorer with cuda_graphs=True")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--via-folder", action="store_true",
                    help="save each model as a transformers folder and let HFLM load it by path, as `lm_eval "
                         "--model hf --model_args pretrained=DIR` does")
    args = ap.parse_args()
    docs = [json.loads(line) for line in open(ROOT / "evals/local_tasks/pydoc_mc.jsonl")]
    reqs = [Instance("loglikelihood", d, (d["context"], c), 0) for d in docs for c in d["choices"]]
    gen_docs = [json.loads(line) for line in open(ROOT / "evals/local_tasks/pydoc_complete.jsonl")]
    gens = [Instance("generate_until", d, (d["context"], {"until": ["."], "max_gen_toks": 16}), 0) for d in gen_docs]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}; {len(docs)} examples = "
          f"{len(reqs)} loglikelihood requests; {len(gens)} generate_until requests (16 new tokens at most); "
          "the harness's HFLM and this repo's batched subclass (evals/harness.py), the same model")
    graphs = " / batched + CUDA graphs" if args.cuda_graphs else ""
    print(f"| model | batch | loglikelihood requests/s: HFLM / batched{graphs} | batched, its forwards alone | "
          "largest score difference | generate_until requests/s |")
    print("|---|---|---|---|---|---|")
    rows = []
    models = [(None, *DualityForCausalLM.from_checkpoint(ck, device)) for ck in args.ckpts]
    models = [(f"{m.config.backbone['name']} + {m.config.pe['name']}", m, t) for _, m, t in models]
    models += list(fresh(args.fresh, args.size, device))
    for name, model, tokenizer in models:
        folder = None
        if args.via_folder:
            import tempfile
            folder = tempfile.mkdtemp()
            t = time.perf_counter()
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            print(f"{name}: saved to {folder} in {time.perf_counter() - t:.1f} s", flush=True)
        for bs in args.batch_sizes:
            from lm_eval.models.huggingface import HFLM
            if folder is None:
                plain = HFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=bs,
                             device=str(device))
            else:
                t = time.perf_counter()
                plain = HFLM(pretrained=folder, batch_size=bs, device=str(device))
                print(f"{name}: HFLM(pretrained=folder) built in {time.perf_counter() - t:.1f} s", flush=True)
            rates, scores = [], []
            batched = hflm(model, tokenizer, batch_size=bs, cuda_graphs=False)  # eager; --cuda-graphs adds the default
            scorers = [plain, batched] + ([hflm(model, tokenizer, batch_size=bs, cuda_graphs=True)]
                                          if args.cuda_graphs else [])
            for lm in scorers:
                # warm-up over every request: each padded shape compiles (and may autotune) once, and HFLM's
                # longest-row padding makes more shapes than the batched scorer's multiples of 64
                lm.loglikelihood(reqs, disable_tqdm=True)
                sync()
                t = time.perf_counter()
                scores.append(lm.loglikelihood(reqs, disable_tqdm=True))
                sync()
                rates.append(len(reqs) / (time.perf_counter() - t))
            forward = len(reqs) / forward_seconds(batched, reqs, sync)
            diff = max(abs(a - b) for (a, _), (b, _) in zip(*scores[:2]))
            # relative to the score: under bf16 autocast both round each sum to bf16 (8 significant bits)
            rel = max(abs(a - b) / max(abs(a), 1e-30) for (a, _), (b, _) in zip(*scores[:2]))
            extra = {}
            if args.cuda_graphs:  # the graphed trunk against the eager one: the same kernels, so the same scores
                extra = dict(graphed_req_s=rates[2], graphed_max_diff=max(
                    abs(a - b) for (a, _), (b, _) in zip(scores[1], scores[2])))
            g = float("nan")
            if not args.no_generate:
                t = time.perf_counter()
                plain.generate_until(gens, disable_tqdm=True)
                sync()
                g = len(gens) / (time.perf_counter() - t)
            shown = " / ".join(f"{r:,.0f}" for r in rates)
            print(f"| {name} | {bs} | {shown} | {forward:,.0f} | {diff:.1e} ({rel:.0e} of it) | {g:,.1f} |", flush=True)
            rows.append(dict(model=name, batch=bs, hflm_req_s=rates[0], batched_req_s=rates[1],
                             batched_forward_req_s=forward, max_score_diff=diff, max_rel_diff=rel, generate_req_s=g,
                             **extra))
    if args.json:
        from duality.common.io import write_atomic
        meta = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", date=time.strftime(
            "%Y-%m-%d"), torch=torch.__version__, requests=len(reqs), size=args.size)
        write_atomic(args.json, json.dumps(dict(meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()
