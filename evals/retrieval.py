"""`eval.py mode=retrieval`: passkey and RULER's needle-in-a-haystack forms (data/tasks/retrieval.py) at a list of
context lengths and needle depths, generated locally from a seed, and the same examples as lm-eval tasks.

    python eval.py ckpt=RUN mode=retrieval 'retrieval.lengths=[1024,4096,16384]'
    python eval.py 'ckpt=[RUN_A,RUN_B]' mode=retrieval retrieval.haystack=noise      # data=retrieval models
    python -m duality.evals.retrieval tasks EXPORT_OR_RUN my_tasks --lengths 1024 4096    # lm-eval task files
    lm_eval --model hf --model_args pretrained=EXPORT,trust_remote_code=True,max_length=5000 \\
            --include_path my_tasks --tasks retrieval

Each example is scored twice (RULER, Hsieh et al. 2024, section 3; lm-eval's loglikelihood):
    string_match  the share of the expected values found in the greedy continuation (cut at a newline or the end
                  of text): RULER's string_match_all
    greedy        under teacher forcing, every answer token is the model's argmax (lm-eval's is_greedy)
    logprob       the answer's log-likelihood, sum over its tokens (no generation: cheap at long lengths)

Results: a JSON record (every example's scores and prediction), the depth x length heatmap of string_match (one
panel per checkpoint), string_match by length (every checkpoint, one figure), and a table in the summary.
The lm-eval tasks (`write_tasks`) are the same examples in JSONL with one YAML per family and length, read by
custom_dataset from their own folder (no network, any working directory); both routes give the same scores
(tests/test_retrieval.py).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from duality.common.errors import ConfigError
from duality.data.tasks import retrieval as R

STOP = "\n"  # generation is cut at the first newline (lm-eval's `until`) or the end-of-text token
SLACK = 4  # tokens generated past the answer's length


def encoder(tok) -> R.Encoder:
    """The generator's view of a checkpoint's tokenizer (duality.data.Tokenizer): word-level for `symbols`."""
    return R.Encoder(tok.encode, word_level=tok.kind == "symbols")


def haystack_sentences(haystack: str, data_cfg: dict | None):
    """The sentences of a documents haystack: the embedded corpus, or data=text's files (data.files)."""
    if haystack == "embedded":
        return R.embedded_sentences()
    if haystack != "text":
        return None
    if not data_cfg or data_cfg.get("name") != "text":
        raise ConfigError("retrieval.haystack=text reads data=text's files: add data=text data.files='my/*.txt'")
    from duality.data.text import _expand
    docs = []
    for f in _expand(data_cfg.get("files")):
        raw = Path(f).read_text(encoding="utf-8", errors="replace")
        if f.endswith((".jsonl", ".json")):
            field = data_cfg.get("text_field", "text")
            docs += [json.loads(line)[field] for line in raw.splitlines() if line.strip()]
        else:
            docs.append(raw)
    return R.documents_sentences(docs)


def examples(enc: R.Encoder, families, lengths, depths: int, samples: int, haystack: str = "repeat",
             sentences=None, values: str = "numbers", digits: int = 7, seed: int = 0) -> list[R.Example]:
    """samples examples per (family, length, depth); depths evenly from 0 to 1. Each from its own seed
    [seed, family, length, depth, sample]: a cell is the same whatever else is asked for."""
    bad = [f for f in families if f not in R.FAMILIES]
    if bad or not families:
        raise ConfigError(f"retrieval.tasks: unknown {bad or 'none given'}; valid choices: {list(R.FAMILIES)}")
    if haystack not in R.HAYSTACKS:
        raise ConfigError(f"retrieval.haystack={haystack!r}; valid choices: {list(R.HAYSTACKS)}")
    if values not in R.VALUES:
        raise ConfigError(f"retrieval.values={values!r}; valid choices: {list(R.VALUES)}")
    out = []
    for f in families:
        for L in lengths:
            for d, depth in enumerate(np.linspace(0, 1, depths) if depths > 1 else [0.5]):
                for s in range(samples):
                    rng = np.random.default_rng([seed, R.FAMILIES.index(f), L, d, s])
                    out.append(R.make_example(f, L, float(depth), rng, enc, haystack, sentences, values, digits))
    return out


def max_new_tokens(exs) -> dict:
    """Tokens to generate per (family, length): the longest answer of the cell and SLACK more (lm-eval's
    max_gen_toks of that task: the same in both routes)."""
    out: dict = {}
    for e in exs:
        key = (e.family, e.length)
        out[key] = max(out.get(key, 0), len(e.answer_ids) + SLACK)
    return out


def string_match(prediction: str, values: list[str]) -> float:
    """RULER's string_match_all for one example: the share of values found in the prediction, ignoring case."""
    p = prediction.lower()
    return sum(v.lower() in p for v in values) / len(values)


def continuation(tok, ids) -> str:
    """Generated ids as text, cut at the end-of-text token and the first newline, stripped (lm-eval's `until`
    and RULER's postprocessing)."""
    ids = [int(i) for i in ids]
    if tok.eot_id in ids:
        ids = ids[:ids.index(tok.eot_id)]
    return tok.decode(ids).split(STOP)[0].strip()


@torch.no_grad()
def score(model, tok, exs: list[R.Example], micro_batch: int, device, autocast=None, generate: bool = True,
          progress: bool = True) -> list[dict]:
    """Per example: greedy (teacher-forced argmax), logprob, and with generate the prediction and string_match.
    Examples of one prompt length go through together, micro_batch at a time (fewer at long lengths)."""
    from duality.model.decode import Decoder
    from duality.model.gpt import varying_shapes
    autocast = autocast or nullcontext()
    budget = max_new_tokens(exs)
    rows: list[dict] = [{} for _ in exs]
    groups: dict = {}
    for i, e in enumerate(exs):
        groups.setdefault((len(e.ids), len(e.answer_ids), budget[(e.family, e.length)]), []).append(i)
    bar = _bar(len(exs), progress)
    for (P, A, new), members in sorted(groups.items()):
        # B x P <= 2^17: the prompt prefills in one chunk (a chunk after the first attends to a cache; FoX then
        # builds its bias densely: 64 GiB at 8 x 32k on an H200)
        rows_per = max(1, min(micro_batch, (1 << 17) // P))
        for s in range(0, len(members), rows_per):
            part = members[s:s + rows_per]
            prompt = torch.tensor(np.stack([exs[i].ids for i in part]), device=device)
            answer = torch.tensor(np.stack([exs[i].answer_ids for i in part]), device=device)
            with autocast:  # teacher forcing: the prompt prefilled in chunks, then the answer's tokens at once
                d = Decoder(model, P + A + 1, fixed=False)
                first = d.prefill(prompt)
                with varying_shapes():
                    rest, _ = model._head(model.trunk(answer[:, :-1], d.cache), None) if A > 1 else (None, None)
            logits = first[:, None].float() if rest is None else torch.cat([first[:, None], rest], 1).float()
            logp = F.log_softmax(logits, -1).gather(-1, answer[..., None])[..., 0].sum(1)
            greedy = (logits.argmax(-1) == answer).all(1)
            if generate:
                with autocast:
                    out = model.generate(prompt, new, temperature=0.0)[:, P:]
            for k, i in enumerate(part):
                rows[i] = {"family": exs[i].family, "length": exs[i].length, "depth": round(exs[i].depth, 4),
                           "tokens": P, "logprob": float(logp[k]), "greedy": float(greedy[k])}
                if generate:
                    pred = continuation(tok, out[k].tolist())
                    rows[i].update(prediction=pred, string_match=string_match(pred, exs[i].values))
            bar.update(len(part))
    bar.close()
    return rows


def _bar(total: int, enabled: bool):
    try:
        from tqdm.auto import tqdm
        return tqdm(total=total, desc="retrieval", unit="example", disable=not enabled, leave=False)
    except ImportError:  # tqdm comes with transformers; without it, no bar
        class _Null:
            def update(self, n):
                pass

            def close(self):
                pass
        return _Null()


def summarize(rows: list[dict], depths: int) -> dict:
    """Means by (family, length), by length (every family) and by (depth bin, length): the table, curve and
    heatmap. Depth bins are the asked depths (the needle's actual depth lies within half a bin of them)."""
    metrics = [m for m in ("string_match", "greedy", "logprob") if rows and m in rows[0]]
    by_cell, by_len, by_depth = {}, {}, {}
    bins = np.linspace(0, 1, depths) if depths > 1 else np.array([0.5])
    for r in rows:
        b = float(bins[int(np.argmin(np.abs(bins - r["depth"])))])
        for key, table in (((r["family"], r["length"]), by_cell), (r["length"], by_len), ((b, r["length"]), by_depth)):
            table.setdefault(key, []).append([r[m] for m in metrics])
    mean = lambda t: {k: dict(zip(metrics, np.mean(v, 0).tolist())) for k, v in t.items()}  # noqa: E731
    return {"metrics": metrics, "cells": {f"{f}@{L}": v for (f, L), v in mean(by_cell).items()},
            "by_length": {str(L): v for L, v in sorted(mean(by_len).items())},
            "heatmap": {f"{b:.2f}@{L}": v for (b, L), v in mean(by_depth).items()}}


def table(summaries: dict, lengths) -> str:
    """Markdown: a row per checkpoint and family, a column per length; string_match (teacher-forced greedy)."""
    head = "| model | task | " + " | ".join(_k(L) for L in lengths) + " |"
    lines = [head, "|" + "---|" * (len(lengths) + 2)]
    for name, s in summaries.items():
        fams = list(dict.fromkeys(k.split("@")[0] for k in s["cells"]))
        for f in fams + ["all"]:
            cells = []
            for L in lengths:
                c = s["by_length"].get(str(L)) if f == "all" else s["cells"].get(f"{f}@{L}")
                if c is None:
                    cells.append("-")
                elif "string_match" in c:
                    cells.append(f"{c['string_match']:.2f} ({c['greedy']:.2f})")
                else:
                    cells.append(f"({c['greedy']:.2f})")
            lines.append(f"| {name} | {f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _k(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def plot_heatmaps(summaries: dict, path, train_lens: dict | None = None) -> None:
    """One panel per checkpoint: needle depth (rows) x context length (columns), colour = string_match (or the
    teacher-forced greedy accuracy where nothing was generated), the training length marked."""
    from duality.common.plots import save_figure
    names = list(summaries)
    cols = min(3, len(names))
    rows_n = math.ceil(len(names) / cols)

    def draw(axes):
        for ax, name in zip(axes, names):
            s = summaries[name]
            metric = "string_match" if "string_match" in s["metrics"] else "greedy"
            keys = [k.split("@") for k in s["heatmap"]]
            depths = sorted({float(b) for b, _ in keys})
            lengths = sorted({int(L) for _, L in keys})
            grid = np.full((len(depths), len(lengths)), np.nan)
            for (b, L), v in zip(keys, s["heatmap"].values()):
                grid[depths.index(float(b)), lengths.index(int(L))] = v[metric]
            im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="upper")
            ax.set_xticks(range(len(lengths)), [_k(L) for L in lengths], fontsize=7)
            ax.set_yticks(range(len(depths)), [f"{100 * d:.0f}%" for d in depths], fontsize=7)
            ax.set_xlabel("context length (tokens)", fontsize=8)
            ax.set_ylabel("needle depth", fontsize=8)
            ax.set_title(f"{name}\n{metric}", fontsize=8)
            T = (train_lens or {}).get(name)
            if T and T in lengths:
                ax.axvline(lengths.index(T) + 0.5, color="black", linewidth=1, linestyle="--")
        for ax in axes[len(names):]:
            ax.axis("off")
        axes[0].figure.colorbar(im, ax=axes[len(names) - 1], shrink=0.8)

    save_figure(path, draw, figsize=(4.2 * cols, 3.4 * rows_n), ncols=cols, nrows=rows_n)


def plot_by_length(summaries: dict, path, train_lens: dict | None = None) -> None:
    """string_match (solid) and teacher-forced greedy accuracy (dashed) against context length, every checkpoint."""
    from duality.common.plots import save_figure

    def draw(axes):
        ax = axes[0]
        for i, (name, s) in enumerate(summaries.items()):
            pts = sorted((int(L), v) for L, v in s["by_length"].items())
            xs = [L for L, _ in pts]
            color = f"C{i % 10}"
            if "string_match" in s["metrics"]:
                ax.plot(xs, [v["string_match"] for _, v in pts], marker="o", color=color, label=name)
            ax.plot(xs, [v["greedy"] for _, v in pts], linestyle="--", marker=".", color=color,
                    label=None if "string_match" in s["metrics"] else name)
            T = (train_lens or {}).get(name)
            if T:
                ax.axvline(T, color=color, linewidth=0.8, linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("accuracy (solid: generated, dashed: teacher-forced)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)

    save_figure(path, draw, figsize=(7, 4.2))


# ------------------------------------------------------------------------------------------------- lm-eval
def write_tasks(exs: list[R.Example], out: Path, tok=None) -> list[str]:
    """The examples as lm-eval tasks in `out`: per family and length a JSONL and two YAMLs, retrieval_<family>_<L>
    (generate_until, string_match) and retrieval_<family>_<L>_ll (loglikelihood: greedy, logprob), tagged
    `retrieval` and `retrieval_ll`; the loader and metrics in local_utils.py beside them. With `tok` each
    prompt is checked to encode to the example's tokens (lm-eval re-encodes the text). Returns the task names."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(__file__).parent / "local_tasks" / "local_utils.py", out / "local_utils.py")
    budget = max_new_tokens(exs)
    cells: dict = {}
    for e in exs:
        if tok is not None and tok.encode(e.prompt) != e.ids.tolist():
            raise ValueError(f"a {e.family} prompt at {e.length} tokens re-encodes to other tokens: its pieces do "
                             "not add up under this tokenizer")
        cells.setdefault((e.family, e.length), []).append(e)
    names = []
    for (family, L), group in cells.items():
        name = f"retrieval_{family}_{L}"
        rows = [{"input": e.prompt, "target": e.answer, "values": e.values, "depth": e.depth, "tokens": len(e.ids)}
                for e in group]
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        common = (f"dataset_path: json\ncustom_dataset: !function local_utils.load\n"
                  f"dataset_kwargs:\n  file: {name}.jsonl\ntest_split: test\ndoc_to_text: input\n"
                  f"doc_to_target: target\ntarget_delimiter: \"\"\n")
        (out / f"{name}.yaml").write_text(
            f"# {family} at {L} tokens: greedy generation scored by RULER's string match (evals/retrieval.py)\n"
            f"task: {name}\ntag: [retrieval, retrieval_{family}]\n{common}output_type: generate_until\n"
            f"generation_kwargs:\n  until: [{json.dumps(STOP)}]\n  max_gen_toks: {budget[(family, L)]}\n"
            f"  do_sample: false\nprocess_results: !function local_utils.process_generation\n"
            f"metric_list:\n  - metric: string_match\n    aggregation: mean\n    higher_is_better: true\n"
            f"metadata:\n  version: 1.0\n")
        (out / f"{name}_ll.yaml").write_text(
            f"# {family} at {L} tokens: the answer under teacher forcing (evals/retrieval.py)\n"
            f"task: {name}_ll\ntag: [retrieval_ll, retrieval_{family}_ll]\n{common}output_type: loglikelihood\n"
            f"process_results: !function local_utils.process_loglikelihood\n"
            f"metric_list:\n  - metric: greedy\n    aggregation: mean\n    higher_is_better: true\n"
            f"  - metric: logprob\n    aggregation: mean\n    higher_is_better: true\nmetadata:\n  version: 1.0\n")
        names += [name, f"{name}_ll"]
    return names


def plot_record(record: Path, out: Path) -> None:
    """A study's record (runs -> label, summary, train_len, as docs/eval/retrieval's) as the heatmap and the curve,
    out.png and out_by_length.png: the figures of several evaluations run apart, drawn as one."""
    runs = json.loads(Path(record).read_text())["runs"].values()
    summaries = {r["label"]: r["summary"] for r in runs}
    train_lens = {r["label"]: r["train_len"] for r in runs}
    plot_heatmaps(summaries, out.with_suffix(".png"), train_lens)
    plot_by_length(summaries, out.with_name(out.stem + "_by_length.png"), train_lens)


def main(argv=None):
    """python -m duality.evals.retrieval tasks CKPT OUT [--tasks ...] [--lengths ...]: lm-eval task files for CKPT's
    tokenizer (a run, a checkpoint or an export). python -m duality.evals.retrieval plot RECORD OUT: a study
    record's figures."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one line, as the other refusals below (argparse's default adds its usage)
            print(f"error: {message} (see --help)", file=sys.stderr)
            raise SystemExit(2)
    ap = Parser(description=main.__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tasks", help="lm-eval task files")
    t.add_argument("ckpt", help="a run's folder, a step_*.pt file or an export: its tokenizer sizes the prompts")
    t.add_argument("out", type=Path, help="the task folder (lm_eval --include_path OUT)")
    # the choices here, not only in examples(): refused by these options' names, before the checkpoint is read
    t.add_argument("--tasks", nargs="+", default=list(R.FAMILIES), choices=list(R.FAMILIES), metavar="TASK",
                   help=f"any of {list(R.FAMILIES)}")
    t.add_argument("--lengths", nargs="+", type=int, default=[1024, 2048, 4096])
    t.add_argument("--depths", type=int, default=11)
    t.add_argument("--samples", type=int, default=4)
    t.add_argument("--haystack", default="repeat", choices=list(R.HAYSTACKS)[:3],
                   help=f"one of {list(R.HAYSTACKS)[:3]} (text, a corpus's sentences: eval.py mode=retrieval)")
    t.add_argument("--values", default="numbers", choices=list(R.VALUES), help=f"one of {list(R.VALUES)}")
    t.add_argument("--digits", type=int, default=7)
    t.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("plot", help="a study record's heatmap and curve")
    p.add_argument("record", type=Path)
    p.add_argument("out", type=Path, help="the heatmap's path (the curve: beside it, _by_length.png)")
    a = ap.parse_args(argv)
    from duality.common.errors import USER_ERRORS
    from duality.data import Tokenizer
    from duality.trainer.checkpoint import read_checkpoint
    try:  # a bad option, checkpoint or record: one line, as eval.py says it (common/cli.py), not a traceback
        if a.command == "plot":
            return plot_record(a.record, a.out)
        tok = Tokenizer.from_dict(read_checkpoint(a.ckpt)[1]["tokenizer"])
        exs = examples(encoder(tok), a.tasks, a.lengths, a.depths, a.samples, a.haystack,
                       haystack_sentences(a.haystack, None), a.values, a.digits, a.seed)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    names = write_tasks(exs, a.out, tok)
    print(f"{len(names)} tasks, {len(exs)} examples in {a.out}: lm_eval ... --include_path {a.out} --tasks "
          "retrieval (generation) or retrieval_ll (teacher forcing)")


if __name__ == "__main__":
    main()
