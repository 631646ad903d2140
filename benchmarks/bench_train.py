"""Training throughput of every backbone x main scheme, next to a nanoGPT-style reference measured in the same run.
(Over 500 lines: the cases, the runner, the FLA peers and the tables report.py draws from its records, kept together.)

    python benchmarks/bench_train.py                                # all cases, 124m:1024 and 370m:4096, eager+compiled
    python benchmarks/bench_train.py --settings 124m:1024 --cases transformer+rope --compile on
    python benchmarks/bench_train.py --settings 370m:16384 --compile on --cases transformer+rope gla+nope
    python benchmarks/bench_train.py --loop                            # the training loop's own cost, and a profile
    python benchmarks/bench_train.py --cases ref transformer+rope --set model.fused_loss=true --tag _fused   # a lever
    python benchmarks/bench_train.py --resume          # go on from the rows of a run cut short (its .partial.json)
    python benchmarks/bench_train.py --merge docs/throughput/bench_train_370m.json docs/throughput/bench_train.json \
        --run I --note "what changed"             # add a run to a history of runs, and redraw its table and plot
    python benchmarks/bench_train.py --summary docs/throughput/bench_train_{124m,370m}.json   # docs/throughput's table
    python benchmarks/bench_train.py --vs-fla docs/memory/fla_peers_370m_4096_h100.json \
        docs/memory/fused_370m_4096_h100.json     # this repo vs FLA's own models (later files win), docs/memory's

A step is what train.py's loop runs (`train.train_step`): forward, backward, gradient clipping, fused AdamW, on one
micro-batch of random tokens already on the GPU, bf16 autocast. Reported: ms per step (median of --steps after
--warmup), tokens/s, MFU (model.flops_per_token: 6 x matmul parameters + the mixer's own FLOPs, causal attention
counted as half the T x T products; over the device's dense bf16 peak), and the allocator's peak memory.

The reference (`ref`) is GPT-2 as nanoGPT writes it: learned positions, LayerNorm, GELU MLP (4 d), SDPA with
is_causal, tied embeddings, logits then F.cross_entropy, fused AdamW, torch.compile, bf16 autocast; at the 370m
settings, the same code at that shape. --loop trains the 124m transformer with train.py itself on the embedded corpus
and compares its logged tokens/s with bare steps of the same model and batch; it also writes a torch.profiler table.

Output: --out/bench_train.{md,json,png} (one row per case x setting x compile; ratios to the reference and to the
transformer + RoPE of the same setting). Every finished case is also written to bench_train.partial.json at once, so a
run that is stopped (a time limit, a lost machine) resumes with --resume where it stopped; Triton's autotuning results
stay in its disk cache (kernels/__init__.py), so a resumed run on the same machine does not tune again.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
from duality.common.io import write_atomic  # noqa: E402
from duality.model import build_model  # noqa: E402
from duality.model.gpt import compile_model  # noqa: E402
from duality.trainer.logger import peak_flops  # noqa: E402
from duality.trainer.optim import make_optimizer, train_step  # noqa: E402
from duality.trainer.runtime import float8_linears  # noqa: E402

# size: (model config, tokens per micro-batch = B x T, vocabulary: GPT-2's padded / seed 004's 32k)
SETTINGS = {"124m": ("124m", 32 * 1024, 50304), "370m": ("370m", 8 * 4096, 32000), "1_3b": ("1_3b", 8 * 4096, 32000)}
# backbone + scheme (Hydra overrides); the first is the baseline of the ratios
CASES = {
    "transformer+rope": ["backbone=transformer", "pe=rope"],
    "transformer+nope": ["backbone=transformer", "pe=nope"],
    "transformer+alibi": ["backbone=transformer", "pe=alibi"],
    "transformer+selective_rope": ["backbone=transformer", "pe=selective_rope"],
    "fox+nope": ["backbone=fox", "pe=nope"],
    "sympow+rope": ["arch=sympow"],
    "conformal_sympow": ["arch=conformal_sympow"],
    "gla+nope": ["backbone=gla", "pe=nope"],
    "gla+selective_rope": ["backbone=gla", "pe=selective_rope"],
    "gated_deltanet+nope": ["backbone=gated_deltanet", "pe=nope"],
    "deltanet+nope": ["backbone=deltanet", "pe=nope"],
    "linear_attn+nope": ["backbone=linear_attn", "pe=nope"],
    "retnet+nope": ["backbone=retnet", "pe=nope"],
    "mamba2+nope": ["backbone=mamba2", "pe=nope"],
    "gated_oja+nope": ["backbone=gated_oja", "pe=nope"],
    "path+nope": ["backbone=path", "pe=nope"],
    "path_fox+nope": ["backbone=path_fox", "pe=nope"],
}


# flash-linear-attention's own causal LMs (what a flame user trains), configured to the same shape as this repo's
# model (d_model, layers, heads, MLP width, vocabulary, untied) and the backbone's head sizes, FLA's defaults otherwise
# (its fused norms, SwiGLU and cross-entropy): (config class, extra config, this repo's case). Not FLA's
# TransformerForCausalLM: its attention is the flash-attn package's, which this repo does not depend on (the
# nanoGPT reference `ref` is the softmax peer).
FLA_CASES = {
    "fla:forgetting_transformer": ("ForgettingTransformerConfig", {}, "fox+nope"),
    "fla:gla": ("GLAConfig", {"expand_k": 0.5, "expand_v": 1.0}, "gla+nope"),
    "fla:gated_deltanet": ("GatedDeltaNetConfig", {"head_dim": None, "expand_v": 1.0}, "gated_deltanet+nope"),
    "fla:delta_net": ("DeltaNetConfig", {"expand_k": 1.0, "expand_v": 1.0, "use_gate": True}, "deltanet+nope"),
    "fla:retnet": ("RetNetConfig", {"expand_k": 1.0, "expand_v": 1.0}, "retnet+nope"),
    "fla:linear_attn": ("LinearAttentionConfig", {"attn_mode": "chunk", "expand_k": 1.0, "expand_v": 1.0,
                                                  "feature_map": "identity"}, "linear_attn+nope"),
    "fla:path_attn": ("PaTHAttentionConfig", {}, "path+nope"),
}


class FLAPeer(nn.Module):
    """One of FLA_CASES: forward(idx, targets) -> (None, loss), as this repo's models are called in a step."""
    flops_per_token = None  # MFU is reported for this repo's models only (their FLOP count convention)

    def __init__(self, case: str, n_layer: int, d: int, n_heads: int, mlp: int, seq_len: int, vocab: int):
        super().__init__()
        import fla.models
        from transformers import AutoModelForCausalLM
        cls_name, extra, _ = FLA_CASES[case]
        extra = {k: (d // n_heads if k == "head_dim" else v) for k, v in extra.items()}  # head_dim: this repo's
        cfg = getattr(fla.models, cls_name)(hidden_size=d, num_hidden_layers=n_layer, num_heads=n_heads,
                                            intermediate_size=mlp, vocab_size=vocab, tie_word_embeddings=False,
                                            max_position_embeddings=seq_len, **extra)
        self.m = AutoModelForCausalLM.from_config(cfg)

    def forward(self, idx, targets):
        return None, self.m(input_ids=idx, labels=idx).loss  # FLA shifts the labels itself


class NanoGPT(nn.Module):
    """GPT-2 the way nanoGPT writes it (bias-free Linear/LayerNorm, as its training default)."""

    def __init__(self, vocab: int, n_layer: int, d: int, n_heads: int, seq_len: int):
        super().__init__()
        self.n_heads, self.n_layer, self.d = n_heads, n_layer, d
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "ln1": nn.LayerNorm(d, bias=False), "qkv": nn.Linear(d, 3 * d, bias=False),
            "proj": nn.Linear(d, d, bias=False), "ln2": nn.LayerNorm(d, bias=False),
            "fc": nn.Linear(d, 4 * d, bias=False), "out": nn.Linear(4 * d, d, bias=False)}) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d, bias=False)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            q, k, v = b["qkv"](b["ln1"](x)).view(B, T, 3, self.n_heads, -1).transpose(1, 3).unbind(2)
            x = x + b["proj"](F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1))
            x = x + b["out"](F.gelu(b["fc"](b["ln2"](x))))
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.float().flatten(0, 1), targets.reshape(-1), ignore_index=-1)

    def flops_per_token(self, seq_len: int) -> float:  # the same convention as model.GPT's
        matmul = sum(p.numel() for n, p in self.named_parameters() if n.startswith("blocks")) + self.wte.weight.numel()
        return 6.0 * matmul + 3.0 * self.n_layer * 2.0 * self.d * (seq_len + 1)


def compose(overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides))


def build(case: str, size: str, seq: int, vocab: int, overrides=(), compiled: bool = False):
    """(model, optim config, compile: model -> what the loop calls) of a case, as train.py builds them (--set applies
    to this repo's models only: FLA's and the reference are compiled whole in the default mode)."""
    if case == "ref":
        m = compose([f"model={size}"]).model
        return NanoGPT(vocab, m.n_layer, m.d_model, m.n_heads, seq), compose([]).optim, compile_model
    if case in FLA_CASES:
        m = compose([f"model={size}"]).model
        return (FLAPeer(case, m.n_layer, m.d_model, m.n_heads, m.mlp_hidden, seq, vocab), compose([]).optim,
                compile_model)
    cfg = compose([*CASES[case], f"model={size}", f"model.seq_len={seq}", *overrides])
    model = build_model(cfg.backbone, cfg.pe, cfg.model, vocab)
    # --set train.activation_checkpointing=... / train.compile_mode=... / train.compile_scope=...; compiled: as
    # train.py sets it up with train.compile=true
    t = cfg.train
    model.set_activation_checkpointing(t.activation_checkpointing, compile_blocks=compiled, compile_mode=t.compile_mode)
    return model, cfg.optim, functools.partial(compile_model, mode=t.compile_mode, scope=t.compile_scope)


def measure(case, size, seq, compiled, steps, warmup, device="cuda", profile: Path | None = None, overrides=(),
            tokens: int | None = None, float8: str | None = None):
    model_name, default_tokens, vocab = SETTINGS[size]
    B = max(1, (tokens or default_tokens) // seq)
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    model, optim_cfg, compile_ = build(case, model_name, seq, vocab, overrides, compiled)
    model = model.to(device)
    if float8:  # as train.float8 converts them (trainer/runtime.py)
        float8_linears(model, float8)
    optimizer = make_optimizer(model, optim_cfg, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    train_model = compile_(model) if compiled else model
    autocast = torch.autocast("cuda", dtype=torch.bfloat16)
    data = torch.randint(0, vocab, (4, B, seq + 1), device=device)
    times, t_compile = [], time.perf_counter()
    for i in range(warmup + steps):
        x, y = data[i % 4, :, :-1].contiguous(), data[i % 4, :, 1:].contiguous()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss, _, _ = train_step(train_model, [(x, y)], 1, optimizer, scheduler, autocast, 1.0)
        end.record()
        if i == 0:
            torch.cuda.synchronize()
            t_compile = time.perf_counter() - t_compile
        if i >= warmup:
            times.append((start, end))
    torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in times)
    if profile is not None:  # 3 more steps under torch.profiler: the kernels by GPU time
        from torch.profiler import ProfilerActivity
        activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(3):
                train_step(train_model, [(data[i, :, :-1], data[i, :, 1:])], 1, optimizer, scheduler,
                                     autocast, 1.0)
            torch.cuda.synchronize()
            profiled_ms = (time.perf_counter() - t0) / 3 * 1e3
        table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=90)
        # the eager ops by input shapes: which tensors the copies, fills and adds outside the compiled graphs touch
        shapes = prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=40, max_shapes_column_width=80)
        events = [e for e in prof.key_averages()  # GPU kernels; not the GPU side of record_function ranges
                  if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
        kernels = [(e.key, e.self_device_time_total) for e in events]
        # calls a step beside each kernel's time: tells one large kernel from many small launches
        listing = "\n".join(f"{e.self_device_time_total / 3e3:8.2f} ms {e.count / 3:6.0f}x  "
                             f"{kernel_kind(e.key)[:24]:24s}  {e.key[:150]}"
                             for e in sorted(events, key=lambda e: -e.self_device_time_total))
        profile.write_text(f"{case} {size}/{seq} compile={compiled}, 3 steps of {B} x {seq} tokens, {ms:.1f} ms a step "
                           f"unprofiled, {profiled_ms:.1f} profiled\n"
                           f"{kernel_breakdown(kernels, 3, ms, profiled_ms)}\n\n{table}\n\n"
                           f"by input shapes:\n{shapes}\n\nevery kernel, ms and calls a step:\n{listing}\n")
    tps = B * seq / (ms / 1e3)
    peak = peak_flops(torch.device(device))
    row = {"case": case, "size": size, "seq_len": seq, "batch": B, "compile": compiled, "ms": ms, "tokens_per_s": tps,
           "mfu": model.flops_per_token(seq) * tps / peak if peak and model.flops_per_token else None,
           "peak_mem_gib": torch.cuda.max_memory_allocated() / 2 ** 30, "first_step_s": t_compile,
           "loss": float(loss)}
    del model, optimizer, train_model, data
    return row


KERNEL_KINDS = [  # (kind, name pattern): the first match wins; what a speed comparison needs to tell apart
    ("matmul", r"gemm|nvjet|cutlass|xmma|cublas|sm90_|sm80_"),
    ("attention (SDPA / flash)", r"flash|fmha|attention"),
    ("optimizer", r"multi_tensor|adam"),
    ("copies / fills", r"^Memcpy|^Memset|copy_kernel|FillFunctor|CatArrayBatched"),
    ("torch.compile (Inductor)", r"^triton_"),
    ("cross-entropy / logits", r"cross_entropy|log_softmax|nll_loss|softmax"),
    ("PyTorch eager elementwise / reductions", r"at::native|elementwise|reduce_kernel"),
    ("hand-written Triton (FLA / kernels/)", r"."),
]


def kernel_kind(name: str) -> str:
    return next(kind for kind, pattern in KERNEL_KINDS if re.search(pattern, name, re.IGNORECASE))


def kernel_breakdown(kernels, steps: int, step_ms: float, profiled_ms: float | None = None) -> str:
    """GPU time per step by kind of kernel, from (kernel name, self device time in us) pairs over `steps` steps;
    the rest of the step time is the GPU idle (launch-bound Python, synchronisations). profiled_ms: the profiled
    steps' own time a step, which the idle time is taken against. Kernel times that sum above it are flagged: on
    2026-11-27 (H100) the profile gave the chunked loss's two Inductor kernels 68 ms a step, timed alone the whole
    loss took 13.6 ms (docs/throughput, "The loss's kernel")."""
    per_kind: dict[str, float] = {}
    for name, us in kernels:
        kind = kernel_kind(name)
        per_kind[kind] = per_kind.get(kind, 0.0) + us / 1e3 / steps
    busy, wall = sum(per_kind.values()), profiled_ms or step_ms
    lines = [f"{'kind':42s} {'ms/step':>8s} {'share':>6s}"]
    for kind, ms in sorted(per_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"{kind:42s} {ms:8.1f} {ms / wall:6.1%}")
    lines.append(f"{'GPU idle (step time - kernel time)':42s} {wall - busy:8.1f} {(wall - busy) / wall:6.1%}")
    if busy > 1.02 * wall:
        lines.append(f"(the kernels sum to {busy:.1f} ms, more than the {wall:.1f} ms step: some kernel times are "
                     "over-counted; time a suspect kernel alone before trusting its row)")
    if profiled_ms and profiled_ms > 1.1 * step_ms:  # quack's GEMMs under the profiler: 735 ms against 190 (H200)
        lines.append(f"(the profiler slowed the steps from {step_ms:.1f} to {profiled_ms:.1f} ms, the host's launches "
                     f"lagging, so most of that idle time is the profiler's; against the unprofiled step the kernels "
                     f"leave {step_ms - busy:.1f} ms)")
    return "\n".join(lines)


def loop_overhead(out: Path, steps: int):
    """train.py on the embedded corpus (its own loader, logging, host syncs) vs bare steps of the same batch."""
    import tempfile
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        ov = ["model=124m", "data.vocab_size=4096", f"out_dir={tmp}/run", f"data.cache_dir={ROOT / 'cache'}",
              "train.global_batch_tokens=32768", "train.micro_batch=32", f"train.steps={steps}",
              f"train.log_interval={steps // 2}", "train.eval_interval=100000", "train.ckpt_interval=100000",
              "train.eval_tokens=32768", "train.sample_tokens=0", "train.progress=false", "logger.mode=disabled",
              "train.profile_steps=5"]
        # the script itself, as a user runs it: its last logged row holds its throughput
        subprocess.run([sys.executable, str(ROOT / "train.py"), *ov], check=True, cwd=ROOT)
        logged = [json.loads(ln) for ln in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
        rows["train.py"] = [r for r in logged if "tokens_per_s" in r][-1]["tokens_per_s"]
        prof = Path(tmp) / "run" / "profile" / "ops.txt"
        (out / "loop_profile.txt").write_text(prof.read_text())
    torch._dynamo.reset()
    cfg = compose(["model=124m", "data.vocab_size=4096"])
    model = build_model(cfg.backbone, cfg.pe, cfg.model, 4096).cuda()
    optimizer = make_optimizer(model, cfg.optim, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    cm = torch.compile(model)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16)
    x = torch.randint(0, 4096, (32, 1025), device="cuda")
    for i in range(steps):
        if i == steps // 2:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        train_step(cm, [(x[:, :-1], x[:, 1:])], 1, optimizer, scheduler, autocast, 1.0)
    torch.cuda.synchronize()
    rows["bare steps"] = (steps - steps // 2) * 32 * 1024 / (time.perf_counter() - t0)
    rows["overhead"] = 1 - rows["train.py"] / rows["bare steps"]
    return rows


def table(rows) -> str:
    runs = any("run" in r for r in rows)  # a history of several runs (--merge) names each row's run
    lines = ["| run " * runs + "| setting | case | compile | ms/step | tokens/s | MFU | × ref | × transformer+rope | "
             "peak GiB |", "|---" * runs + "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        head = (f"| {r['run']} " if runs else "") + \
            f"| {r['size']}/{r['seq_len']} | {r['case']} | {'on' if r['compile'] else 'off'} | "
        if "error" in r:
            lines.append(head + f"{r['error']} | | | | | |")
            continue
        f = lambda v, fmt: "" if v is None else format(v, fmt)  # noqa: E731
        lines.append(head + f"{r['ms']:.1f} | {r['tokens_per_s']:,.0f} | {f(r['mfu'], '.3f')} | "
                            f"{f(r.get('x_ref'), '.2f')} | {f(r.get('x_base'), '.2f')} | {r['peak_mem_gib']:.1f} |")
    return "\n".join(lines)


def plot(rows, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = sorted({(r["size"], r["seq_len"]) for r in rows if "error" not in r})
    if not groups:  # every case failed: the table says why, there is nothing to draw
        return
    fig, axes = plt.subplots(len(groups), 1, figsize=(11, 3.2 * len(groups)), squeeze=False)
    for ax, (size, seq) in zip(axes[:, 0], groups):
        sel = [r for r in rows if (r["size"], r["seq_len"]) == (size, seq) and "error" not in r]
        names = list(dict.fromkeys(r["case"] for r in sel))
        modes = sorted({r["compile"] for r in sel})
        w = 0.8 / len(modes)
        for j, comp in enumerate(modes):
            vals = [next((r["tokens_per_s"] / 1e3 for r in sel if r["case"] == n and r["compile"] == comp), 0)
                    for n in names]
            xs = [i + (j - (len(modes) - 1) / 2) * w for i in range(len(names))]
            ax.bar(xs, vals, w, label="torch.compile" if comp else "eager")
            for x, n in zip(xs, names):  # a case that failed in this mode (out of memory, ...) says so
                err = next((r["error"] for r in rows if key(r) == (n, size, seq, comp) and "error" in r), None)
                if err:
                    ax.text(x, 2, err.split(":")[0].replace("OutOfMemoryError", "out of memory"), rotation=90,
                            ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("k tokens/s")
        ax.set_title(f"{size}, context {seq}", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def key(r):
    return r["case"], r["size"], r["seq_len"], r["compile"]


def merge(history: Path, run_json: Path, run_id: str, note: str):
    """Append the rows of one run (bench_train's JSON) to a history of runs as run `run_id`, then rewrite the
    history's markdown (every row, with its run) and plot (each case's latest row)."""
    hist = json.loads(history.read_text()) if history.exists() else {"runs": {}, "rows": []}
    run = json.loads(run_json.read_text())
    if run_id in hist["runs"]:
        sys.exit(f"{history} already has a run {run_id!r}; its runs: {', '.join(hist['runs'])}")
    hist["runs"][run_id] = {"command": run["command"], "note": f"{run['date']}, {note}" if note else run["date"]}
    hist["rows"] += [{**r, "run": run_id} for r in run["rows"]]
    for k in ("device", "torch", "date"):
        hist[k] = hist.get(k) or run[k]
    history.write_text(json.dumps(hist, indent=1))
    runs = "\n".join(f"- run {i}: `{v['command']}` — {v['note']}" for i, v in hist["runs"].items())
    history.with_suffix(".md").write_text(
        f"{hist['device']}, {hist['date']}, torch {hist['torch']}, bf16; {len(hist['runs'])} runs, each with its own "
        "transformer + RoPE (the baseline of its `× transformer+rope` column) and `× ref` where the run had the "
        "reference:\n\n"
        f"{runs}\n\nThe PNG beside this file draws each case's latest row.\n\n{table(hist['rows'])}\n")
    latest = {key(r): r for r in hist["rows"]}  # later runs replace earlier rows of the same case
    plot(list(latest.values()), history.with_suffix(".png"))


def load_rows(path: Path) -> list[tuple[str, dict]]:
    """(where it was measured, row) for every row of a bench_train JSON: a run ({"rows"}), a history (--merge), or
    a record of several device calls ({"calls": [{"call", "rows"}]}, docs/memory); rows marked `valid: false`
    (measured before a fix) are left out."""
    data = json.loads(Path(path).read_text())
    name = Path(path).name
    if isinstance(data, list):
        pairs = [(name, r) for r in data]
    elif "calls" in data:
        pairs = [(f"{name} {c['call']}", r) for c in data["calls"] for r in c["rows"]]
    else:
        pairs = [(f"{name} run {r['run']}" if "run" in r else name, r) for r in data["rows"]]
    return [(src, r) for src, r in pairs if r.get("valid", True)]


def failure(r) -> str:
    """A failed row's error in a table cell."""
    return "out of memory" if "OutOfMemory" in r["error"] else "failed"


def summary(histories) -> str:
    """One table of every case's latest row across histories (--merge files): ms per step and, in brackets, tokens/s
    as a multiple of the transformer + RoPE of the same run, one column per setting x mode."""
    latest = {}
    for h in histories:
        for _, r in load_rows(h):
            latest[key(r)] = r
    cols = sorted({(r["size"], r["seq_len"], r["compile"]) for r in latest.values()},
                  key=lambda c: (c[0], c[1], not c[2]))
    cases = list(dict.fromkeys(["ref", *CASES]))

    def cell(r):
        if r is None:
            return ""
        if "error" in r:
            return failure(r)
        return f"{r['ms']:.1f} ({r['x_base']:.2f})" if r.get("x_base") else f"{r['ms']:.1f}"
    lines = ["| case | " + " | ".join(f"{s}/{t} {'compiled' if c else 'eager'}" for s, t, c in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for case in cases:
        cells = [cell(latest.get((case, *c))) for c in cols]
        if any(cells):
            lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def vs_fla_pairs(paths) -> list[tuple[str, str, str, int, tuple | None, tuple | None, tuple]]:
    """(ours, FLA's case, size, seq, ours compiled, ours eager, FLA's) for each of FLA_CASES measured, each entry a
    (where, row) pair: FLA's latest row (later files and rows replace earlier ones) and this repo's rows from the same
    device call as it where there are some (ratios of one machine), else their latest."""
    rows = defaultdict(list)  # every valid row of a case, in file and row order
    for path in paths:
        for src, r in load_rows(path):
            rows[key(r)].append((src, r))
    latest = {k: v[-1] for k, v in rows.items()}

    def beside(k, fla):
        same = [e for e in rows.get(k, []) if e[0] == fla[0]]
        return same[-1] if same else latest.get(k)
    out = []
    for size, seq in sorted({(k[1], k[2]) for k in latest}):
        for peer, (_, _, ours) in FLA_CASES.items():
            fla = latest.get((peer, size, seq, False))
            if fla is None:
                continue
            comp, eager = beside((ours, size, seq, True), fla), beside((ours, size, seq, False), fla)
            if comp is not None or eager is not None:
                out.append((ours, peer, size, seq, comp, eager, fla))
    return out


def vs_fla(paths) -> str:
    """This repo's models against FLA's own of the same kind (vs_fla_pairs): FLA's eager (its best mode:
    compiled, its models were slower or failed, docs/memory); speed = FLA's ms / ours compiled, memory = ours
    compiled peak / FLA's. The issue's goals: memory <= 1.00x at speed >= 1.30x."""
    def cell(entry):
        if entry is None:
            return "not measured"
        r = entry[1]
        if "error" in r:
            return failure(r)
        return f"{r['ms']:.1f} / {r['peak_mem_gib']:.1f}"
    lines = ["| kind | this repo, compiled: ms / peak GiB | this repo, eager | FLA's model, eager | speed / memory vs "
             "FLA | goals met (speed / memory) | measured in |", "|---|---:|---:|---:|---:|---|---|"]
    for ours, peer, size, seq, comp, eager, fla in vs_fla_pairs(paths):
        ratios, goals = "", ""
        if comp and "error" not in comp[1] and "error" not in fla[1]:
            speed, mem = fla[1]["ms"] / comp[1]["ms"], comp[1]["peak_mem_gib"] / fla[1]["peak_mem_gib"]
            ratios = f"{speed:.2f}x / {mem:.2f}x"
            goals = f"{'yes' if speed >= 1.3 else 'no'} / {'yes' if mem <= 1.0 else 'no'}"
        sources = dict.fromkeys(e[0] for e in (comp, eager, fla) if e)
        where = "one call: " + next(iter(sources)) if len(sources) == 1 else "; ".join(sources)
        lines.append(f"| {ours} vs `{peer}` ({size}/{seq}) | {cell(comp)} | {cell(eager)} | {cell(fla)} | "
                     f"{ratios} | {goals} | {where} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", nargs="+", default=["124m:1024", "370m:4096"], help="size:context")
    ap.add_argument("--cases", nargs="+", default=["ref", *CASES], help=f"ref and/or {list(CASES)}")
    ap.add_argument("--compile", choices=["on", "off", "both"], default="both")
    ap.add_argument("--tokens", type=int, help="tokens per step (batch = tokens // context) instead of the "
                    "setting's (124m: 32,768, 370m: 32,768), e.g. 65536 for one 65,536-token step at every context")
    ap.add_argument("--float8", nargs="+", default=["none"], choices=["none", "tensorwise", "rowwise"],
                    help="also each case with torchao's float8 training of its Linear layers (case label "
                         "CASE:float8-RECIPE; this repo's cases only)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--loop", action="store_true", help="measure the training loop's overhead instead")
    ap.add_argument("--profile", action="store_true", help="write each case's top kernels (torch.profiler) to --out")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="Hydra overrides for every case but ref, e.g. model.fused_loss=true backbone.short_conv=true")
    ap.add_argument("--out", default=str(ROOT / "docs" / "throughput"))
    ap.add_argument("--tag", default="", help="suffix of the output files")
    ap.add_argument("--resume", action="store_true", help="keep the rows of bench_train{tag}.partial.json in --out "
                    "(a run cut short) and measure only the cases it lacks")
    ap.add_argument("--merge", nargs=2, metavar=("HISTORY", "RUN"), type=Path,
                    help="add RUN (a bench_train JSON) to HISTORY (JSON of several runs) and redraw its md/png")
    ap.add_argument("--run", help="--merge: the new run's name (A, B, ...)")
    ap.add_argument("--note", default="", help="--merge: what the run measured (code, Triton version, ...)")
    ap.add_argument("--summary", nargs="+", metavar="HISTORY", help="print one table of the latest rows of these "
                    "histories (docs/throughput's)")
    ap.add_argument("--vs-fla", nargs="+", metavar="JSON", type=Path, help="print the table of this repo's models "
                    "against FLA's own from these bench_train JSON files (docs/memory's)")
    args = ap.parse_args()
    if args.vs_fla:
        return print(vs_fla(args.vs_fla))
    if args.summary:
        return print(summary(args.summary))
    if args.merge:
        if not args.run:
            sys.exit("--merge needs --run NAME")
        return merge(*args.merge, args.run, args.note)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        sys.exit("bench_train.py measures GPU throughput: no CUDA device is visible")
    meta = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "command": " ".join(sys.argv)}
    if args.loop:
        res = {**meta, **loop_overhead(out, 60)}
        (out / "loop_overhead.json").write_text(json.dumps(res, indent=1))
        print(json.dumps(res, indent=1))
        return
    unknown = [c for c in args.cases if c != "ref" and c not in CASES and c not in FLA_CASES]
    if unknown:
        sys.exit(f"unknown case(s) {unknown}; valid: ref, {', '.join(CASES)}, {', '.join(FLA_CASES)}")
    partial = out / f"bench_train{args.tag}.partial.json"
    rows = json.loads(partial.read_text()) if args.resume and partial.exists() else []
    done = {key(r) for r in rows}
    if rows:
        print(f"resuming: {len(rows)} rows from {partial}", flush=True)
    for setting in args.settings:
        size, seq = setting.split(":")
        for compiled in {"on": [True], "off": [False], "both": [False, True]}[args.compile]:
            for case, f8 in ((c, f) for c in args.cases for f in args.float8
                             if f == "none" or c in CASES):
                label = case if f8 == "none" else f"{case}:float8-{f8}"
                if (label, size, int(seq), compiled) in done:
                    continue
                try:
                    mode = "compiled" if compiled else "eager"
                    name = label.replace("+", "-").replace(":", "-")  # '+' and ':' are not portable in file names
                    prof = out / f"profile_{name}_{size}_{seq}_{mode}{args.tag}.txt"  # --tag: one file per run
                    r = measure(case, size, int(seq), compiled, args.steps, args.warmup,
                                profile=prof if args.profile else None, overrides=args.set, tokens=args.tokens,
                                float8=None if f8 == "none" else f8)
                    r["case"] = label
                except Exception as e:  # noqa: BLE001 -- one failing case (OOM, a kernel limit) must not end the run
                    r = {"case": label, "size": size, "seq_len": int(seq), "compile": compiled,
                         "error": f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"}
                    torch.cuda.empty_cache()
                rows.append(r)
                print(json.dumps(r), flush=True)
                write_atomic(partial, json.dumps(rows, indent=1))  # a kill mid-write keeps the last whole file
    ok = {key(o): o for o in rows if "error" not in o}
    for r in rows:
        if "error" not in r:
            ref, base = (ok.get((c, r["size"], r["seq_len"], r["compile"])) for c in ("ref", "transformer+rope"))
            r["x_ref"] = r["tokens_per_s"] / ref["tokens_per_s"] if ref else None
            r["x_base"] = r["tokens_per_s"] / base["tokens_per_s"] if base else None
    (out / f"bench_train{args.tag}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    partial.unlink(missing_ok=True)  # rows so far, for a run cut short
    md = f"{meta['device']}, {meta['date']}, torch {meta['torch']}: `{meta['command']}`\n\n" + table(rows) + "\n"
    if any(r["case"] in FLA_CASES for r in rows):  # FLA's models measured in this run: the comparison beside
        md += "\n" + vs_fla([out / f"bench_train{args.tag}.json"]) + "\n"
    (out / f"bench_train{args.tag}.md").write_text(md)
    plot(rows, out / f"bench_train{args.tag}.png")
    print(md)


if __name__ == "__main__":
    main()
