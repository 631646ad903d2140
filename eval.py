"""Evaluate a checkpoint. Its saved config rebuilds the model and tokenizer; this file's own config (conf/eval.yaml)
says what to measure.

    python eval.py ckpt=outputs/transformer-rope-tiny/checkpoints/latest mode=perplexity
    python eval.py ckpt=... mode=sample prompt="The module" max_new_tokens=100 temperature=0.8
    python eval.py ckpt=... mode=perplexity data=text data.files='held_out/*.txt'   # any data config
    python eval.py ckpt=outputs/gla-selective_rope-S2-L1 mode=task +data_overrides.eval_len=1024  # synthetic task

Modes: perplexity (validation loss and perplexity on the checkpoint's data, or any other data config, at any
context length), sample (generation through each mixer's cache / recurrent state; a task's prompt is its token
names, e.g. prompt="<bos> h e l l o <copy>"), task (accuracy and accuracy vs length on the synthetic task the
checkpoint was trained on, regenerated from its data config, optionally changed by data_overrides: longer
evaluation, other test settings; writes a PNG).
"""

from __future__ import annotations

import json
import math
from contextlib import nullcontext
from pathlib import Path

import torch

from model import ConfigError, build_model

MODES = ("perplexity", "sample", "task")


def resolve_ckpt(path: str) -> Path:
    """A checkpoint file, a `latest` pointer, a checkpoints/ folder or a run's out_dir."""
    p = Path(path)
    for cand in (p, p / "latest", p / "checkpoints" / "latest"):
        if cand.is_file() and cand.name == "latest":
            return cand.parent / cand.read_text().strip()
        if cand.is_file():
            return cand
    raise ConfigError(f"ckpt={path!r}: no checkpoint there (give a step_*.pt file, a checkpoints/ folder or a run's out_dir)")


def load_model(path: str, device="cpu"):
    from data import Tokenizer
    from train import load_checkpoint
    ckpt = load_checkpoint(resolve_ckpt(path))
    cfg = ckpt["config"]
    model = build_model(cfg["backbone"], cfg["pe"], cfg["model"], ckpt["vocab_size"])
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), Tokenizer.from_dict(ckpt["tokenizer"]), ckpt


@torch.no_grad()
def perplexity(model, tok, data_cfg, seq_len: int, n_tokens: int, micro_batch: int, device, autocast) -> dict:
    """Mean next-token loss over the first n_tokens of the data's validation split, tokenized by the model's own
    tokenizer, in windows of seq_len (which may exceed the training context)."""
    import data as data_lib
    info = data_lib.prepare(data_cfg, progress=False, tokenizer=tok)
    windows = data_lib.TokenWindows(info.val_shards, seq_len, tok.vocab_size, shuffle=False)
    n = min(len(windows), max(1, n_tokens // seq_len))
    total, count = 0.0, 0
    for i in range(0, n, micro_batch):
        x, y = windows.batch(range(i, min(n, i + micro_batch)))
        with autocast:
            _, loss = model(x.to(device), y.to(device))
        total += loss.item() * y.numel()
        count += y.numel()
    loss = total / count
    return {"val_loss": loss, "val_ppl": math.exp(min(loss, 50)), "tokens": count, "seq_len": seq_len}


def task_accuracy(model, ckpt, cfg, device, autocast) -> dict:
    from omegaconf import OmegaConf

    from data import tasks
    data_cfg = dict(ckpt["config"]["data"])
    if not tasks.is_task(data_cfg):
        raise ConfigError(f"mode=task needs a checkpoint trained on a synthetic task; this one used data={data_cfg['name']}")
    data_cfg.update(OmegaConf.to_container(cfg.data_overrides, resolve=True) if cfg.data_overrides else {})
    data_cfg["train_examples"] = 1  # only the evaluation sets are needed
    task = tasks.build(data_cfg)
    result = tasks.evaluate(model, task, cfg.micro_batch, device, autocast)
    curve = result["curve"]
    shown = tasks.log_points(curve, task.train_len)
    print(f"task {task.name} (trained to {task.unit} {task.train_len}) | {tasks.summary(result, task)}")
    print("  ".join(f"{k.split('@')[1]}: {v:.3f}" for k, v in shown.items()))
    run_dir = resolve_ckpt(cfg.ckpt).parent.parent
    plot = Path(cfg.plot) if cfg.plot else run_dir / "eval_accuracy_vs_length.png"
    c = ckpt["config"]
    tasks.plot_curves({f"{c['backbone']['name']} + {c['pe']['name']}": curve}, plot, task.train_len, task.unit,
                      title=f"{task.name}: {c.get('run_name', '')}")
    print(f"plot: {plot}")
    return {**result, "task": task.name, "train_len": task.train_len, "unit": task.unit, "plot": str(plot),
            "curve": {str(k): v for k, v in curve.items()}}


def run(cfg) -> dict:
    from omegaconf import OmegaConf
    if cfg.mode not in MODES:
        raise ConfigError(f"mode={cfg.mode!r}; valid choices: {list(MODES)}")
    if cfg.ckpt is None:
        raise ConfigError("ckpt=<path> is required (a step_*.pt file, a checkpoints/ folder or a run's out_dir)")
    device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if cfg.device == "auto" else cfg.device))
    model, tok, ckpt = load_model(cfg.ckpt, device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    if cfg.mode == "perplexity":
        data_cfg = ckpt["config"]["data"] if cfg.get("data") is None else OmegaConf.to_container(cfg.data, resolve=True)
        seq = cfg.seq_len or ckpt["config"]["model"]["seq_len"]
        result = perplexity(model, tok, data_cfg, seq, cfg.eval_tokens, cfg.micro_batch, device, autocast)
        print(f"val loss {result['val_loss']:.4f} | perplexity {result['val_ppl']:.2f} | "
              f"{result['tokens']:,} tokens at context {seq}")
    elif cfg.mode == "task":
        result = task_accuracy(model, ckpt, cfg, device, autocast)
    else:
        try:
            ids = tok.encode(cfg.prompt)
        except ValueError as e:
            raise ConfigError(f"prompt={cfg.prompt!r}: {e}") from None
        prompt = torch.tensor([ids or [tok.eot_id]], device=device)
        gen = torch.Generator(device).manual_seed(cfg.seed)
        with autocast:
            out = model.generate(prompt, cfg.max_new_tokens, cfg.temperature, cfg.top_k, generator=gen)
        result = {"prompt": cfg.prompt, "text": tok.decode(out[0].tolist())}
        print(result["text"])
    result.update(ckpt=str(resolve_ckpt(cfg.ckpt)), step=ckpt["step"], mode=cfg.mode)
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(result, indent=1))
    return result


def main():
    from train import cli
    cli(run, "eval")


if __name__ == "__main__":
    main()
