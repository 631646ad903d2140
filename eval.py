"""Evaluate checkpoints. A checkpoint's saved config rebuilds its model and tokenizer; this file's own config
(conf/eval.yaml) says what to measure. `ckpt` is one checkpoint or a list of them, compared in one table or plot.

    python eval.py ckpt=outputs/gla-rope-124m mode=lm_eval                      # seed 004's tasks + wikitext
    python eval.py ckpt=RUN mode=export out=exports/gla-rope dtype=bfloat16    # a transformers model folder (hf.py)
    python eval.py ckpt=RUN mode=lm_eval lm_eval.include_path=evals/local_tasks 'lm_eval.tasks=[pydoc]'
    python eval.py 'ckpt=[RUN_A,RUN_B]' mode=position_loss data=text data.files='long/*.txt'
    python eval.py ckpt=RUN mode=perplexity seq_len=4096                       # any data config, any context
    python eval.py ckpt=RUN mode=sample prompt="The module" max_new_tokens=100 temperature=0.8
    python eval.py ckpt=RUN mode=task +data_overrides.eval_len=1024             # a synthetic task's accuracy
    python eval.py mode=kernel 'kernel.fresh=[transformer/alibi,retnet/nope,fox/nope,transformer/rope]'
    python eval.py 'ckpt=[RUN_A,RUN_B]' mode=retrieval 'retrieval.lengths=[1024,4096,16384]'  # passkey, NIAH

Modes:
  lm_eval        lm-evaluation-harness scores through its HFLM, batched (evals/harness.py); a seed-004 markdown table
  export         config.json + model.safetensors + tokenizer, for AutoModelForCausalLM after `import duality.hf`
  position_loss  next-token loss by position over long held-out windows (evals/position.py); JSON + log-x PNG
  perplexity     validation loss / perplexity; with several checkpoints also loss vs training context (PNG)
  sample         generation through each mixer's KV cache / recurrent state
  task           accuracy and accuracy vs length on the checkpoint's synthetic task (data_overrides change it)
  kernel         each layer's relative-position kernel: log-decay / bias and rotation vs distance (evals/pe_kernel.py)
  retrieval      passkey and needle-in-a-haystack by context length and depth (evals/retrieval.py); JSON, heatmap,
                 curve and a markdown table

Results go to `out` (JSON; default eval_<mode>.json in the run's folder, or in outputs/eval for several
checkpoints) and PNGs beside it; `wandb=true` also logs them to a wandb run (offline without credentials).
"""

from __future__ import annotations

import json
import math
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from omegaconf import OmegaConf

from duality.common.errors import ConfigError
from duality.common.io import write_atomic
from duality.model import build_model
from duality.trainer.checkpoint import load_model
from duality.trainer.checkpoint import newest_checkpoint as resolve_ckpt

MODES = ("perplexity", "sample", "task", "lm_eval", "position_loss", "kernel", "export", "retrieval")
DTYPES = ("float32", "bfloat16", "float16")


def labels(configs, paths) -> list[str]:
    """'backbone + pe (T=context)' per checkpoint config; the path is added where two would read the same."""
    names = [f"{c['backbone']['name']} + {c['pe']['name']} (T={c['model']['seq_len']})" for c in configs]
    return [f"{n} {p}" if names.count(n) > 1 else n for n, p in zip(names, paths)]


@torch.no_grad()
def perplexity(model, tok, data_cfg, seq_len: int, n_tokens: int, micro_batch: int, device, autocast,
               doc_boundaries: bool = False) -> dict:
    """Mean next-token loss over the first n_tokens of the data's validation split, tokenized by the model's own
    tokenizer, in windows of seq_len (which may exceed the training context); with doc_boundaries, documents packed
    and kept apart, as a model trained with train.doc_boundaries saw them."""
    from duality import data as data_lib
    from duality.trainer.objective import validation_loss  # training's own validation, in one process
    info = data_lib.prepare(data_cfg, progress=False, tokenizer=tok)
    windows = info.windows("val", seq_len, shuffle=False)
    n = min(len(windows), max(1, n_tokens // seq_len))
    loss = validation_loss(model, windows, n, micro_batch, device, autocast, 0, 1,
                           tok.eot_id if doc_boundaries else None)
    return {"val_loss": loss, "val_ppl": math.exp(min(loss, 50)), "tokens": n * seq_len, "seq_len": seq_len}


def task_accuracy(model, ckpt, cfg, device, autocast, plot: Path) -> dict:

    from duality.data import tasks
    data_cfg = dict(ckpt["config"]["data"])
    if not tasks.is_task(data_cfg):
        raise ConfigError("mode=task needs a checkpoint trained on a synthetic task; this one used "
                          f"data={data_cfg['name']}")
    data_cfg.update(OmegaConf.to_container(cfg.data_overrides, resolve=True) if cfg.data_overrides else {})
    data_cfg["train_examples"] = 1  # only the evaluation sets are needed
    task = tasks.build(data_cfg)
    result = tasks.evaluate(model, task, cfg.micro_batch, device, autocast)
    curve = result["curve"]
    shown = tasks.log_points(curve, task.train_len)
    print(f"task {task.name} (trained to {task.unit} {task.train_len}) | {tasks.summary(result, task)}")
    print("  ".join(f"{k.split('@')[1]}: {v:.3f}" for k, v in shown.items()))
    c = ckpt["config"]
    tasks.plot_curves(tasks.labelled_curves(f"{c['backbone']['name']} + {c['pe']['name']}", result), plot,
                      task.train_len, task.unit, title=f"{task.name}: {c.get('run_name', '')}")
    print(f"plot: {plot}")
    return {**result, "task": task.name, "train_len": task.train_len, "unit": task.unit, "plot": str(plot),
            **{k: {str(p): v for p, v in result[k].items()}
               for k in ("curve", "curve_seq", "curve_char") if k in result}}


def sample(model, tok, cfg, device, autocast) -> dict:
    try:
        ids = tok.encode(cfg.prompt)
    except ValueError as e:
        raise ConfigError(f"prompt={cfg.prompt!r}: {e}") from None
    prompt = torch.tensor([ids or [tok.eot_id]], device=device)
    gen = torch.Generator(device).manual_seed(cfg.seed)
    with autocast:
        out = model.generate(prompt, cfg.max_new_tokens, cfg.temperature, cfg.top_k, generator=gen, top_p=cfg.top_p)
    text = tok.decode(out[0].tolist())
    print(text)
    return {"prompt": cfg.prompt, "text": text}


def retrieval(cfg, loaded, names, device, autocast, plot: Path, out: Path) -> dict:
    """Every checkpoint on the same needles (each tokenizer sizes its own prompts): scores per example, a summary
    per family x length and depth x length, the heatmap, the curve by length and the table."""
    from duality.evals import retrieval as RV
    C = cfg.retrieval
    lengths = sorted(int(L) for L in C.lengths)
    new = 4 * ((C.digits or 7) + 2) + RV.SLACK  # room for the longest answer (4 values) and what follows it
    for (model, _, ckpt), name in zip(loaded, names):
        pe = model.abs_pe
        if pe is not None and pe.max_positions < lengths[-1] + new:
            raise ConfigError(f"{name}: pe={pe.name} has {pe.max_positions} positions; retrieval.lengths asks for "
                              f"{lengths[-1]} (+ the answer): learned positions cannot extrapolate. Drop the longer "
                              "lengths or evaluate a relative scheme")
    per_model, summaries, seconds, settings = {}, {}, {}, {}
    for (model, tok, ckpt), name in zip(loaded, names):
        # haystack / digits null: a data=retrieval model's own (its training distribution), else repeat / 7
        own = ckpt["config"].get("data") or {}
        own = own if own.get("name") == "retrieval" else {}
        hay, digits = C.haystack or own.get("haystack", "repeat"), C.digits or own.get("digits", 7)
        sentences = RV.haystack_sentences(hay, OmegaConf.to_container(cfg.data, resolve=True)
                                          if cfg.get("data") is not None else None)
        exs = RV.examples(RV.encoder(tok), list(C.tasks), lengths, C.depths, C.samples, hay, sentences,
                          C["values"], digits, cfg.seed)
        settings[name] = {"haystack": hay, "digits": digits, "examples": len(exs)}
        start = time.perf_counter()
        rows = RV.score(model, tok, exs, cfg.micro_batch, device, autocast, generate="generate" in C.scoring)
        seconds[name] = round(time.perf_counter() - start, 1)
        per_model[name], summaries[name] = rows, RV.summarize(rows, C.depths)
    train_lens = {n: ck["config"]["model"]["seq_len"] for (_, _, ck), n in zip(loaded, names)}
    text = RV.table(summaries, lengths)
    print(text)
    print("seconds per checkpoint: " + ", ".join(f"{n}: {s}" for n, s in seconds.items()))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text + "\n")
    RV.plot_heatmaps(summaries, plot, train_lens)
    RV.plot_by_length(summaries, plot.with_name(plot.stem + "_by_length.png"), train_lens)
    return {"summary": summaries, "examples": per_model, "seconds": seconds, "train_len": train_lens,
            "settings": {**OmegaConf.to_container(C, resolve=True), "per_checkpoint": settings}, "seed": cfg.seed}


def compose_config(overrides):
    """train.py's config for these overrides, from inside a Hydra app (eval.py's) or outside one."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    if GlobalHydra.instance().is_initialized():
        return compose("config", overrides=list(overrides))
    with initialize_config_dir(str(Path(__file__).resolve().parent / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def fresh_models(specs, device, size: str = "tiny", seq_len: int | None = None, vocab: int = 256):
    """'backbone/pe' -> (label, a model at init of conf/model/<size>.yaml), for kernel pictures and benchmarks."""
    conf = Path(__file__).resolve().parent / "conf"
    for spec in specs:
        if spec.count("/") != 1:
            raise ConfigError(f"kernel.fresh entry {spec!r}: write backbone/pe, e.g. transformer/alibi")
        b, p = spec.split("/")
        for group, name in (("backbone", b), ("pe", p)):
            if not (conf / group / f"{name}.yaml").is_file():
                choices = sorted(f.stem for f in (conf / group).glob("*.yaml"))
                raise ConfigError(f"kernel.fresh entry {spec!r}: unknown {group} {name!r}; valid choices: {choices}")
        cfg = compose_config([f"backbone={b}", f"pe={p}", f"model={size}"])  # presets extend their schemas
        size_cfg = OmegaConf.to_container(cfg.model, resolve=True)
        size_cfg["seq_len"] = seq_len or size_cfg["seq_len"]
        torch.manual_seed(0)
        model = build_model(cfg.backbone, cfg.pe, size_cfg, vocab)
        yield f"{b} + {p} (init)", model.to(device).eval()


def kernels(cfg, loaded, names, device) -> dict:
    from duality.evals.pe_kernel import relative_kernel
    T, g = cfg.kernel.length, torch.Generator().manual_seed(cfg.seed)
    models = [(n, m, tok) for n, (m, tok, _) in zip(names, loaded)] + [
        (n, m, None) for n, m in fresh_models(cfg.kernel.fresh, device, seq_len=T)]
    if not models:
        raise ConfigError("mode=kernel needs ckpt=... and/or kernel.fresh=[backbone/pe, ...]")
    found = {}
    for name, model, tok in models:
        if tok is not None and cfg.kernel.text:  # real text through a trained model's own tokenizer
            ids = (tok.encode(cfg.kernel.text) * T)[:T]
            idx = torch.tensor([ids], device=device)
        else:
            idx = torch.randint(0, model.cfg.vocab_size, (4, T), generator=g).to(device)
        found[name] = relative_kernel(model, idx, cfg.kernel.layer)
    return found


def data_config(cfg, ckpt) -> dict:
    """The checkpoint's own data, or the data config given on the command line (data=text data.files=...)."""
    if cfg.get("data") is not None:
        return OmegaConf.to_container(cfg.data, resolve=True)
    if "data" not in ckpt["config"]:
        raise ConfigError(f"{ckpt.get('export', 'this checkpoint')} holds no data config (an export written before "
                          "exports kept their run's): give the data, e.g. data=text data.files='held/*.txt'")
    return ckpt["config"]["data"]


def check_options(cfg) -> None:
    """Every numeric option in range, before any checkpoint is read (a ConfigError naming the option and its range):
    micro_batch=0 ended in a traceback, micro_batch=-3 reported a loss of 0, temperature=-1 sampled garbage."""
    def need(key, ok, what):
        value = OmegaConf.select(cfg, key)
        if not ok(value):
            raise ConfigError(f"{key}={value!r}: must be {what}")
    pos = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1  # noqa: E731
    need("micro_batch", pos, "an integer >= 1")
    need("eval_tokens", pos, "an integer >= 1")
    need("seq_len", lambda v: v is None or pos(v), "null (the training context) or an integer >= 1")
    need("max_new_tokens", pos, "an integer >= 1")
    need("temperature", lambda v: isinstance(v, (int, float)) and v >= 0, "a number >= 0 (0: greedy)")
    need("top_k", lambda v: v is None or pos(v), "null (no limit) or an integer >= 1")
    need("top_p", lambda v: v is None or (isinstance(v, (int, float)) and 0 < v <= 1), "null or in (0, 1]")
    need("lm_eval.batch_size", lambda v: pos(v) or v == "auto" or (isinstance(v, str) and v.startswith("auto:")),
         "an integer >= 1 or auto")
    need("lm_eval.limit", lambda v: v is None or (isinstance(v, (int, float)) and v > 0), "null or > 0")
    need("lm_eval.max_length", lambda v: v is None or pos(v), "null (the training context) or an integer >= 1")
    need("position_loss.length", lambda v: v is None or (pos(v) and v >= 2), "null or an integer >= 2")
    need("position_loss.max_windows", pos, "an integer >= 1")
    need("position_loss.chunk", pos, "an integer >= 1")
    need("kernel.length", lambda v: pos(v) and v >= 2, "an integer >= 2")
    need("kernel.layer", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0")
    need("retrieval.lengths", lambda v: len(v) > 0 and all(pos(x) for x in v), "a list of lengths in tokens >= 1")
    need("retrieval.depths", pos, "an integer >= 1 (depths evenly from 0% to 100%)")
    need("retrieval.samples", pos, "an integer >= 1")
    need("retrieval.digits", lambda v: v is None or (pos(v) and v <= 18), "null or an integer in 1..18")
    need("retrieval.scoring", lambda v: len(v) > 0 and set(v) <= {"generate", "loglikelihood"},
         "a list of generate and/or loglikelihood")


def run(cfg) -> dict:
    if cfg.mode not in MODES:
        raise ConfigError(f"mode={cfg.mode!r}; valid choices: {list(MODES)}")
    check_options(cfg)
    paths = [] if cfg.ckpt is None else [cfg.ckpt] if isinstance(cfg.ckpt, str) else list(cfg.ckpt)
    if not paths and cfg.mode != "kernel":
        raise ConfigError("ckpt=<path> is required (a step_*.pt file, a checkpoints/ folder, a run's out_dir, or a "
                          "list: 'ckpt=[a,b]')")
    if cfg.mode == "retrieval":  # the task names and haystack before any checkpoint is read
        from duality.data.tasks.retrieval import FAMILIES, HAYSTACKS, VALUES
        for key, valid in (("tasks", FAMILIES), ("haystack", HAYSTACKS), ("values", VALUES)):
            given = cfg.retrieval[key]
            bad = ([t for t in given if t not in valid] if key == "tasks"
                   else [] if given in (None, *valid) else [given])
            if bad:
                raise ConfigError(f"retrieval.{key}: unknown {bad}; valid choices: {list(valid)}")
    if len(paths) > 1 and cfg.mode in ("sample", "task", "export"):
        raise ConfigError(f"mode={cfg.mode} takes one checkpoint; got {len(paths)}")
    for p in paths:  # every path checked before any work
        resolve_ckpt(p)
    device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if cfg.device == "auto" else cfg.device))
    if cfg.mode == "lm_eval" and cfg.lm_eval.cuda_graphs not in (True, False, "auto"):
        raise ConfigError(f"lm_eval.cuda_graphs={cfg.lm_eval.cuda_graphs!r}; valid choices: auto, true, false")
    if cfg.mode == "lm_eval" and cfg.lm_eval.cuda_graphs is True and device.type != "cuda":
        raise ConfigError(f"lm_eval.cuda_graphs=true needs a CUDA device; this run's is {device} (device={cfg.device})")
    if cfg.dtype not in (None, *DTYPES):
        raise ConfigError(f"dtype={cfg.dtype!r}; valid choices: {list(DTYPES)} or null (float32 weights, bf16 autocast "
                          "on a GPU)")
    if cfg.mode == "lm_eval":  # the tasks and their data are checked before any model is loaded
        try:
            from duality.evals import harness
        except ImportError as e:
            raise ConfigError(f"mode=lm_eval needs lm-evaluation-harness ({e}): pip install lm-eval") from None
        task_manager = harness.load_tasks(list(cfg.lm_eval.tasks), cfg.lm_eval.include_path)
    if cfg.mode == "export":  # a folder, not a JSON of results
        from duality.hf import export
        out = export(paths[0], cfg.out or resolve_ckpt(paths[0]).parent.parent / "hf", cfg.dtype or "float32")
        print(f"exported {resolve_ckpt(paths[0])} -> {out}: " + ", ".join(sorted(p.name for p in out.iterdir())))
        return {"mode": "export", "out": str(out), "ckpt": str(resolve_ckpt(paths[0]))}
    # float32 weights run under bf16 autocast on a GPU (training's precision); weights cast to dtype= run in it
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" and not cfg.dtype
                else nullcontext())
    out = Path(cfg.out) if cfg.out else (
        (resolve_ckpt(paths[0]).parent.parent if len(paths) == 1 else Path("outputs/eval")) / f"eval_{cfg.mode}.json")
    plot = Path(cfg.plot) if cfg.plot else out.with_suffix(".png")
    loaded = [load_model(p, device) for p in paths] if cfg.mode != "lm_eval" else []  # lm_eval: one at a time
    if cfg.dtype:
        loaded = [(model.to(getattr(torch, cfg.dtype)), tok, ck) for model, tok, ck in loaded]
    names = labels([ck["config"] for _, _, ck in loaded], paths)

    if cfg.mode == "kernel":
        from duality.evals.pe_kernel import plot_kernels
        found = kernels(cfg, loaded, names, device)
        plot_kernels(found, plot, title=f"layer {cfg.kernel.layer}: weight of a key at distance t - j")
        result = {"kernels": {n: {k: v.tolist() for k, v in ks.items()} for n, ks in found.items()}}
    elif cfg.mode == "lm_eval":
        L, configs, scores = cfg.lm_eval, [], []
        from duality.hf import DualityForCausalLM
        for path in paths:
            model, tokenizer = DualityForCausalLM.from_checkpoint(path, device)
            if cfg.dtype:
                model.to(getattr(torch, cfg.dtype))
            lm = harness.hflm(model, tokenizer, batch_size=L.batch_size, max_length=L.max_length,
                              cuda_graphs=L.cuda_graphs)
            scores.append(harness.evaluate(lm, list(L.tasks), task_manager, L.num_fewshot, L.limit)["results"])
            configs.append({g: getattr(model.config, g) for g in ("backbone", "pe", "model")})
            del model, lm
        names = labels(configs, paths)
        rows = {name: harness.columns({"results": r}) for name, r in zip(names, scores)}
        raw = {str(p): r for p, r in zip(paths, scores)}
        table = harness.markdown_table(rows)
        print(table)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text(table + "\n")
        result = {"table": rows, "results": raw, "tasks": list(L.tasks), "num_fewshot": L.num_fewshot}
    elif cfg.mode == "retrieval":
        result = retrieval(cfg, loaded, names, device, autocast, plot, out)
    elif cfg.mode == "position_loss":
        from duality.evals.position import plot_position_loss, position_loss
        P, curves = cfg.position_loss, {}
        for (model, tok, ckpt), name in zip(loaded, names):
            r = position_loss(model, tok, data_config(cfg, ckpt), P.length, P.max_windows, cfg.micro_batch, P.chunk,
                              device, autocast)
            curves[name] = {**r, "train_len": ckpt["config"]["model"]["seq_len"]}
            shown = "  ".join(f"{n}: {v:.3f}" for n, v in r["avg_up_to"].items() if n >= 16)
            print(f"{name} | {r['windows']} x {r['length']:,} tokens | mean loss up to n tokens: {shown}")
        plot_position_loss(curves, plot)
        result = {"curves": curves}
    else:
        result = {}
        for (model, tok, ckpt), name, path in zip(loaded, names, paths):
            if cfg.mode == "perplexity":
                seq = cfg.seq_len or ckpt["config"]["model"]["seq_len"]
                r = perplexity(model, tok, data_config(cfg, ckpt), seq, cfg.eval_tokens, cfg.micro_batch, device,
                               autocast, bool(ckpt["config"].get("train", {}).get("doc_boundaries")))
                print(f"{name} | val loss {r['val_loss']:.4f} | perplexity {r['val_ppl']:.2f} | "
                      f"{r['tokens']:,} tokens at context {seq}")
            elif cfg.mode == "task":
                r = task_accuracy(model, ckpt, cfg, device, autocast, plot)
            else:
                r = sample(model, tok, cfg, device, autocast)
            r.update(ckpt=str(resolve_ckpt(path)), step=ckpt["step"])
            result = r if len(paths) == 1 else {**result, name: r}
        if cfg.mode == "perplexity" and len(paths) > 1:
            from duality.evals.position import plot_loss_vs_context
            groups: dict = {}
            for (_, _, ckpt), name in zip(loaded, names):
                c = ckpt["config"]
                groups.setdefault(f"{c['backbone']['name']} + {c['pe']['name']}", []).append(
                    (c["model"]["seq_len"], result[name]["val_loss"]))
            plot_loss_vs_context(groups, plot)
    result.update(mode=cfg.mode, ckpts=[str(resolve_ckpt(p)) for p in paths])
    write_atomic(out, json.dumps(result, indent=1))
    print(f"results: {out}" + (f" | plot: {plot}" if plot.exists() and cfg.mode not in ("sample", "lm_eval") else ""))
    if cfg.wandb:
        log_wandb(cfg, result, plot, out)
    return result


def log_wandb(cfg, result: dict, plot: Path, out: Path) -> None:
    """One wandb run per evaluation (job_type=eval): the table's numbers as summary values, the plot as an image."""
    import wandb

    from duality.trainer.logger import wandb_init
    run = wandb_init(cfg.get("wandb_mode", "auto"), project=cfg.wandb_project, job_type="eval",
                     defaults={"name": f"eval-{cfg.mode}", "dir": str(out.parent)},
                     config=OmegaConf.to_container(cfg, resolve=True))
    if run is None:  # WANDB_MODE=disabled
        return
    if cfg.mode == "lm_eval":
        cols = list(dict.fromkeys(c for r in result["table"].values() for c in r))
        run.log({"lm_eval": wandb.Table(columns=["model", *cols],
                                        data=[[n, *(r.get(c) for c in cols)] for n, r in result["table"].items()])})
        for name, r in result["table"].items():
            run.summary.update({f"{name}/{c}": v for c, v in r.items()})
    if plot.exists() and cfg.mode not in ("sample", "lm_eval"):
        run.log({cfg.mode: wandb.Image(str(plot))})
    run.finish()


def main():
    from duality.common.cli import cli
    cli(run, "eval")


if __name__ == "__main__":
    main()
