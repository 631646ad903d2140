"""Decoding speed on a GPU: ms a new token, tokens/s and peak memory, this repo's models and FLA's own in one run.

    python benchmarks/bench_decode.py                                   # the default grid (below), a table on stdout
    python benchmarks/bench_decode.py --cases gla --batches 1 --prompts 512 --new 64
    python benchmarks/bench_decode.py --json docs/inference/decode_h200_DATE.json --plot docs/inference/decode.png
    python benchmarks/bench_decode.py --profile gla:1:512               # a profile of decoding steps (kernels by time)

Each case is the 370m shape (conf/model/370m.yaml, 32k vocabulary), random weights in bf16, greedy decoding of
--new tokens after a prompt of random tokens, through the route a user takes: this repo's models through
DualityForCausalLM.generate (its loop: model/decode.py, a CUDA graph a step), FLA's models through their generate
(transformers' loop with FLA's cache). A token's time is (generate's time - the prefill's) / new tokens, each the
median of --repeats timed runs after one untimed run (kernels compiled and autotuned, graphs captured). A setting
that does not fit in memory is recorded as such."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch

import duality.kernels.tuned_configs  # noqa: F401  (FLA's kernels autotune from the shipped configs)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import FLA_CASES  # noqa: E402

CASES = {"gla": ("gla", "nope"), "gated_deltanet": ("gated_deltanet", "nope"), "transformer": ("transformer", "rope"),
         "gla+selective_rope": ("gla", "selective_rope"), "mamba2": ("mamba2", "nope"), "fox": ("fox", "rope")}
PEERS = {"fla:gla": "fla:gla", "fla:gated_deltanet": "fla:gated_deltanet"}


def build(case: str, vocab: int = 32000):
    """(model on the GPU in bf16, eval mode) for a case name of CASES or PEERS."""
    from omegaconf import OmegaConf
    size = OmegaConf.to_container(OmegaConf.load(Path(__file__).resolve().parents[1] / "conf/model/370m.yaml"))
    torch.manual_seed(0)
    if case in PEERS:
        import fla.models  # noqa: F401  (registers FLA's classes with the Auto classes)
        from transformers import AutoModelForCausalLM
        cls_name, extra, _ = FLA_CASES[PEERS[case]]
        d, H = size["d_model"], size["n_heads"]
        extra = {k: (d // H if k == "head_dim" else v) for k, v in extra.items()}
        cfg = getattr(fla.models, cls_name)(hidden_size=d, num_hidden_layers=size["n_layer"], num_heads=H,
                                            intermediate_size=size["mlp_hidden"], vocab_size=vocab,
                                            tie_word_embeddings=False, **extra)
        m = AutoModelForCausalLM.from_config(cfg)
    else:
        from duality.hf import DualityConfig, DualityForCausalLM
        backbone, pe = CASES[case]
        model = {k: v for k, v in size.items() if k not in ("name", "head")}
        m = DualityForCausalLM(DualityConfig(backbone={"name": backbone}, pe={"name": pe}, model=model,
                                             vocab_size=vocab, autocast=None))
    m.generation_config.eos_token_id = None  # random weights: decode every token asked for
    m.generation_config.pad_token_id = 0
    return m.to(device="cuda", dtype=torch.bfloat16).eval()


def _timed(fn) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


@torch.no_grad()
def measure(model, batch: int, prompt: int, new: int, repeats: int, compile_step: bool = False) -> dict:
    ids = torch.randint(1, 32000, (batch, prompt), device="cuda")
    mask = torch.ones_like(ids)
    own = hasattr(model, "hidden_states")  # this repo's model: its prefill is the trunk and one head row

    def prefill():
        if own:
            from duality.model.decode import Decoder
            Decoder(model.model, prompt + new).prefill(ids)
        else:
            model(input_ids=ids, use_cache=True, logits_to_keep=1)

    def gen():
        extra = {"compile_step": True} if compile_step else {}
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=0, do_sample=False, **extra)
        assert out.shape == (batch, prompt + new), out.shape

    torch.cuda.reset_peak_memory_stats()
    gen()  # compiles, autotunes, captures
    prefill()
    total = statistics.median(_timed(gen) for _ in range(repeats))
    pre = statistics.median(_timed(prefill) for _ in range(repeats))
    ms = 1e3 * (total - pre) / new
    return {"batch": batch, "prompt": prompt, "new": new, "ms_per_token": round(ms, 3),
            "tokens_per_s": round(batch * 1e3 / ms, 1), "prefill_ms": round(1e3 * pre, 1),
            "generate_ms": round(1e3 * total, 1), "peak_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)}


def profile(case: str, batch: int, prompt: int, steps: int = 20, rows: int = 25) -> str:
    """torch.profiler's table of `steps` decoding steps (the CUDA graph replays, and the same steps eagerly so that
    each kernel is named), kernels by GPU time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    from duality.model.decode import Decoder
    model = build(case)
    ids = torch.randint(1, 32000, (batch, prompt), device="cuda")
    out = []
    for graphs in (True, False):
        with torch.no_grad():
            d = Decoder(model.model, prompt + steps + 3, graphs=graphs)
            tok = d.prefill(ids).argmax(-1, keepdim=True)
            for _ in range(2):
                tok = d.step(tok).argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
                t = time.perf_counter()
                for _ in range(steps):
                    tok = d.step(tok).argmax(-1, keepdim=True)
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t) / steps
        out.append(f"== {case} batch {batch} prompt {prompt}, {'graphed' if graphs else 'eager'} steps: "
                   f"{1e3 * wall:.3f} ms a step (under the profiler)\n"
                   + p.key_averages().table(sort_by="cuda_time_total", row_limit=rows))
    return "\n".join(out)


def plot(record: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
    for ax, batch in zip(axes, (1, 32)):
        for case in dict.fromkeys(r["case"] for r in record["rows"]):
            pts = sorted((r["prompt"], r["ms_per_token"]) for r in record["rows"]
                         if r["case"] == case and r["batch"] == batch and "ms_per_token" in r)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=case, linestyle="--" if case.startswith("fla:") else "-")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("ms per new token")
        ax.set_title(f"batch {batch}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(f"Greedy decoding, 370m, bf16 ({record['device']}, {record['date']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=["gla", "gated_deltanet", "transformer", "fla:gla"],
                    help=f"any of {sorted(CASES) + sorted(PEERS)}")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32, 128])
    ap.add_argument("--prompts", nargs="+", type=int, default=[512, 4096, 32768])
    ap.add_argument("--peer-grid", default="1:512,32:512,1:4096",
                    help="batch:prompt settings for FLA's models (their loop is ~50 ms a token: the full grid "
                         "would take most of a GPU session)")
    ap.add_argument("--new", type=int, default=128, help="new tokens per generate")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--profile", help="case:batch:prompt; prints a profile of decoding steps and exits")
    ap.add_argument("--compile-step", action="store_true",
                    help="this repo's models decode with generate(compile_step=True) (torch.compile'd step)")
    ap.add_argument("--commit", help="the commit of the tree measured (default: git's HEAD, which a copied tree "
                    "without its .git may not know)")
    args = ap.parse_args()
    if args.profile:
        case, b, p = args.profile.split(":")
        print(profile(case, int(b), int(p)))
        return
    import fla
    import triton
    record = {"date": str(date.today()), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "fla": fla.__version__,
              "commit": args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                      text=True).stdout.strip(),
              "command": "python benchmarks/bench_decode.py " + " ".join(sys.argv[1:]), "rows": []}
    peer_grid = {tuple(int(x) for x in s.split(":")) for s in args.peer_grid.split(",")}
    print(f"{'case':<22}{'batch':>6}{'prompt':>8}{'ms/token':>10}{'tokens/s':>11}{'prefill ms':>12}{'peak GiB':>10}")
    for case in args.cases:
        model = build(case)
        for prompt in args.prompts:
            for batch in args.batches:
                if case in PEERS and (batch, prompt) not in peer_grid:
                    continue
                row = {"case": case + (" (compiled step)" if args.compile_step and case not in PEERS else "")}
                try:
                    row.update(measure(model, batch, prompt, args.new, args.repeats,
                                       args.compile_step and case not in PEERS))
                    print(f"{case:<22}{batch:>6}{prompt:>8}{row['ms_per_token']:>10.3f}{row['tokens_per_s']:>11.0f}"
                          f"{row['prefill_ms']:>12.1f}{row['peak_gib']:>10.1f}", flush=True)
                except torch.OutOfMemoryError:
                    row.update(batch=batch, prompt=prompt, new=args.new, oom=True)
                    print(f"{case:<22}{batch:>6}{prompt:>8}   does not fit in memory", flush=True)
                torch.cuda.empty_cache()
                record["rows"].append(row)
                if args.json:  # after every row: a run stopped by a time limit keeps what it measured
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    args.json.write_text(json.dumps(record, indent=1) + "\n")
        del model
        torch.cuda.empty_cache()
    if args.plot:
        plot(record, args.plot)


if __name__ == "__main__":
    main()
