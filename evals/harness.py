"""lm-evaluation-harness through its own Hugging Face model class, HFLM, on this repo's transformers model (hf.py).

    python -m duality.evals.harness --model hf --model_args pretrained=EXPORT_DIR --tasks lambada_openai,piqa
    python -m duality.evals.harness --model hf-batched ...                 # the same, scored a batch at a time
    python -m duality.evals.harness --model hf-batched --model_args pretrained=DIR,cuda_graphs=False ...  # eager
    python eval.py ckpt=RUN mode=lm_eval                                   # seed 004's task set + wikitext
    python eval.py ckpt=RUN mode=lm_eval 'lm_eval.tasks=[my_task]' lm_eval.include_path=my_tasks/

The first is the harness's CLI itself (every argument passes through) after `import duality.hf` has registered
model_type "duality" with the Auto classes; `hf-batched` is HFLM with its loglikelihood scored a batch at a time
(batched_hflm); eval.py scores a training checkpoint without exporting it (the same scorer on the same model, built
in memory). HFLM does the requests, rolling windows and stopping; what stays here is what the harness lacks: each
task's data checked before any model loads (an offline task fails naming its dataset, rather than mid-run), the
batched loglikelihood, and seed 004's Table 3 as one markdown row per checkpoint.

Offline: only local task folders (include_path) are indexed when every requested task is found there; the
harness's ~15,000 built-in tasks are indexed (~20 s) only when needed.
"""

from __future__ import annotations

import difflib
import math
import sys
from functools import lru_cache

import torch

from duality.common.errors import ConfigError

# seed 004 Table 3 (the GLA / DeltaNet task set) and wikitext perplexity; the metric each column shows
SEED_TASKS = {"lambada_openai": ("perplexity", "acc"), "piqa": ("acc",), "hellaswag": ("acc_norm",),
              "winogrande": ("acc",), "arc_easy": ("acc",), "arc_challenge": ("acc_norm",),
              "wikitext": ("word_perplexity",)}
GENERIC = ("acc", "acc_norm", "exact_match", "perplexity", "word_perplexity")


def hflm(model, tokenizer, batch_size: int = 16, max_length: int | None = None, cuda_graphs: bool | str = "auto"):
    """The harness's HFLM (as batched_hflm's subclass) around a DualityForCausalLM already in memory (hf.py), as
    `--model hf` builds it from a folder."""
    if model.model.decoder is not None:
        raise ConfigError("mode=lm_eval needs a language model; this checkpoint has model.head=compress")
    return batched_hflm()(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=batch_size,
                          max_length=max_length, device=str(model.device), cuda_graphs=cuda_graphs)


class GraphedTrunk:
    """model.hidden_states (hf.py) replayed from one CUDA graph per input shape. A 124m model's eager forward at
    scoring's shapes is bound by the host: 8-30 ms of Python and launches for 3-4 ms of GPU work (H200, 2026-11-27,
    docs/evaluation.md); a replay launches the whole forward at once. Each shape is run once eagerly (kernels
    compiled and autotuned outside the capture), then captured; all graphs share one memory pool, so a replay may
    overwrite what another shape's replay returned: use each output before the next call. A forward that cannot be
    captured (a copy from the CPU, a read-back) fails naming the way out; it is not retried eagerly, since a failed
    capture leaves the process's CUDA random generator unusable (seen on an H200, 2026-11-27)."""

    def __init__(self, model):
        if model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device, not {model.device}")
        self.model, self.graphs, self.pool = model, {}, None

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        shape = tuple(input_ids.shape)
        if shape not in self.graphs:
            try:
                self.graphs[shape] = self._capture(input_ids)
            except RuntimeError as e:
                raise RuntimeError(f"a CUDA graph could not capture this model's forward ({e}); score it eagerly: "
                                   "lm_eval.cuda_graphs=false (eval.py) or --model_args ...,cuda_graphs=False") from e
        graph, static_in, static_out = self.graphs[shape]
        static_in.copy_(input_ids)
        graph.replay()
        return static_out

    def _capture(self, input_ids):
        static_in = input_ids.clone()
        side = torch.cuda.Stream()  # the warm-up on a side stream, as torch.cuda.graph's documentation does it
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.model.hidden_states(static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            static_out = self.model.hidden_states(static_in)
        self.pool = graph.pool()
        return graph, static_in, static_out


PAD_TO = 64  # rows padded to a multiple of this on a GPU: few distinct shapes for the kernels (and their tuning)


@lru_cache(maxsize=1)
def batched_hflm():
    """HFLM with its loglikelihood scored a batch at a time (built on first use: lm-eval is imported only then).

    HFLM scores each request on its own after the batch's forward: a slice, an argmax, a comparison and a float()
    that each wait for the GPU, and it pads every batch to its longest row (2.3-2.7x slower than a batched scorer,
    docs/evaluation.md). This subclass keeps HFLM's requests, truncation (the last max_length + 1 tokens) and
    results, and changes only how they are computed: rows sorted by length, each distinct row run once (the choices
    of a multiple-choice question that differ in their last token share it), right-padded to a multiple of PAD_TO,
    the log-softmax taken only at the continuation's positions, and one transfer to the CPU a batch. A causal model
    gives right padding no influence on the real positions, so the scores are HFLM's (tests/test_eval.py).
    This repo's model (hf.py: hidden_states, logits_at) runs its head only at the continuations' positions, and on a
    GPU its trunk from a CUDA graph per padded shape (GraphedTrunk: 2-5.5x the old adapter's requests/s at 124m,
    H200, docs/evaluation.md). cuda_graphs: "auto" (the default) graphs this repo's model on a CUDA device (every
    backbone and scheme captures: tests/test_gpu.py) and runs anything else eagerly, True graphs or fails, False runs
    eagerly (`--model_args ...,cuda_graphs=False`)."""
    import numpy as np
    import torch.nn.functional as F
    from lm_eval.models.huggingface import HFLM
    from tqdm import tqdm

    class BatchedHFLM(HFLM):
        def __init__(self, *args, cuda_graphs: bool | str = "auto", **kwargs):
            if cuda_graphs not in (True, False, "auto"):  # the harness passes model_args' True/False as bools
                raise ConfigError(f"cuda_graphs={cuda_graphs!r}; valid choices: auto, True, False")
            super().__init__(*args, **kwargs)
            own = all(callable(getattr(self.model, n, None)) for n in ("hidden_states", "logits_at"))  # hf.py's
            can = own and self.device.type == "cuda" and self.backend == "causal"
            if cuda_graphs is True and not can:
                raise ConfigError(f"cuda_graphs=True needs this repo's model (hf.py) on a CUDA device; got "
                                  f"{type(self.model).__name__} on {self.device}")
            self.trunk = None if not own else (GraphedTrunk(self.model) if can and cuda_graphs is not False
                                               else self.model.hidden_states)

        def _forward(self, inp, row_of, pos):
            """The logits [tokens, V] at rows row_of, positions pos of the padded batch inp: this repo's model runs
            its head at those positions only; another model runs HFLM's _model_call, every position."""
            if self.trunk is None:
                return self._model_call(inp)[row_of, pos]
            return self.model.logits_at(self.trunk(inp)[row_of, pos])

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            """HFLM's tokenization of each (context, continuation), in two calls of a fast tokenizer's Rust
            encoder instead of two Python-level encodes per request (~0.1 s of a pass over 800 requests on a
            CPU profile, docs/evaluation.md): the context's trailing whitespace moves to the continuation, the
            whole is encoded and split at the context's length (lm_eval's _encode_pair). Empty contexts, slow
            tokenizers, a BOS-prefixed string or an explicit add_bos_token take HFLM's own path."""
            args = [r.args for r in requests]
            bos = self.tokenizer.decode(self.prefix_token_id)
            if (self.backend != "causal" or not getattr(self.tokenizer, "is_fast", False) or self.enable_thinking
                    or self.add_bos_token is not None
                    or any(not c or (bos and (c + x).startswith(bos)) for c, x in args)):
                return super().loglikelihood(requests, disable_tqdm)
            ctxs, conts = [], []
            for c, x in args:
                n = len(c) - len(c.rstrip())
                ctxs.append(c[:len(c) - n])
                conts.append(c[len(c) - n:] + x)
            backend = self.tokenizer.backend_tokenizer
            # ids only: the fast variant skips the offsets (1.8x on 800 requests); each distinct context once (a
            # multiple-choice question's choices share theirs)
            encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
            wholes = [e.ids for e in encode([c + x for c, x in zip(ctxs, conts)])]
            distinct = list(dict.fromkeys(ctxs))
            heads = dict(zip(distinct, (e.ids for e in encode(distinct))))
            return self._loglikelihood_tokens([((c, x), heads[h], w[len(heads[h]):])
                                               for (c, x), h, w in zip(args, ctxs, wholes)], disable_tqdm=disable_tqdm)

        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
            if self.backend != "causal" or (self.batch_size == "auto" and not override_bs):
                return super()._loglikelihood_tokens(requests, disable_tqdm, override_bs)
            # each request: its row (HFLM's truncation) and where its continuation sits in it
            rows, uses = {}, []
            for _, ctx, cont in requests:
                if not ctx or not cont or len(cont) > self.max_length:
                    raise ValueError(f"a loglikelihood request needs a context, a continuation and at most "
                                     f"max_length={self.max_length} continuation tokens (got {len(ctx)}, {len(cont)})")
                row = tuple((ctx + cont)[-(self.max_length + 1):][:-1])
                uses.append((rows.setdefault(row, len(rows)), cont))
            unique = sorted(rows, key=len, reverse=True)
            where = {rows[r]: i for i, r in enumerate(unique)}
            by_row = [[] for _ in unique]  # the requests each distinct row serves
            for j, (r, cont) in enumerate(uses):
                by_row[where[r]].append(j)
            bs = int(override_bs or self.batch_size)
            pad = PAD_TO if self.device.type == "cuda" else 1  # a CPU gains nothing from fewer shapes
            out = [None] * len(requests)
            for start in tqdm(range(0, len(unique), bs), disable=disable_tqdm or self.rank != 0,
                              desc="Running loglikelihood requests (batched)"):
                batch = unique[start:start + bs]
                width = min(-(-len(batch[0]) // pad) * pad, self.max_length)
                inp = np.zeros((len(batch), width), dtype=np.int64)
                # every continuation token of the batch, flat: its request (0..served-1), row, position, target
                served, req, row_of, pos, tgt = [], [], [], [], []
                for i, row in enumerate(batch):
                    inp[i, :len(row)] = row
                    for j in by_row[start + i]:
                        cont = uses[j][1]
                        req += [len(served)] * len(cont)
                        row_of += [i] * len(cont)
                        pos += range(len(row) - len(cont), len(row))
                        tgt += cont
                        served.append(j)
                req, row_of, pos, tgt = torch.tensor([req, row_of, pos, tgt]).to(self.device, non_blocking=True)
                logits = self._forward(torch.from_numpy(inp).to(self.device), row_of, pos)  # [tokens, vocab]
                logp = F.log_softmax(logits, dim=-1, dtype=self.softmax_dtype)
                # HFLM's score is a request's log-probs summed in their dtype; here summed in float64, then rounded
                lp = logp.gather(-1, tgt[:, None])[:, 0]
                ll = torch.zeros(len(served), device=lp.device, dtype=torch.float64).index_add_(0, req, lp.double())
                ll = ll.to(lp.dtype)
                miss = torch.zeros(len(served), device=lp.device).index_add_(0, req, (logp.argmax(-1) != tgt).float())
                for j, value, m in zip(served, *torch.stack([ll.double(), miss.double()]).tolist()):  # one transfer
                    out[j] = (value, m == 0)
                    if requests[j][0] is not None:
                        self.cache_hook.add_partial("loglikelihood", requests[j][0], out[j])
            return out

    return BatchedHFLM


# ---- tasks ---------------------------------------------------------------------------------------------------------
@lru_cache(maxsize=4)
def task_manager(include_path: str | None, defaults: bool):
    from lm_eval.tasks import TaskManager
    return TaskManager(include_path=include_path, include_defaults=defaults)


def load_tasks(names: list[str], include_path: str | None = None):
    """The TaskManager that knows every requested task, after checking each task's data can be loaded."""
    tm = task_manager(include_path, False) if include_path else None
    if tm is None or any(not tm.match_tasks([n]) for n in names):
        tm = task_manager(include_path, True)
    unknown = [n for n in names if not tm.match_tasks([n])]
    if unknown:
        hints = {n: difflib.get_close_matches(n, tm.all_tasks, n=3) for n in unknown}
        raise ConfigError(f"unknown lm_eval task(s) {unknown}; close matches: {hints} (custom tasks: a folder of task "
                          f"YAMLs as lm_eval.include_path=...; list built-ins with `lm-eval ls tasks`)")
    for n in names:  # loading builds each task's dataset: fail here, naming it, rather than mid-run
        try:
            tm.load([n])
        except Exception as e:  # datasets / hub raise many types (ConnectionError, FileNotFoundError, ...)
            entry = tm.task_index.get(n)
            raise ConfigError(
                f"lm_eval task {n!r} cannot load its data ({type(e).__name__}: {str(e).splitlines()[0][:300]}). "
                f"{_dataset_hint(entry)}Offline, a hub dataset must already be in the datasets cache "
                f"(HF_DATASETS_CACHE); or point a task YAML at local JSONL files (docs/evaluation.md)") from None
    return tm


def _dataset_hint(entry) -> str:
    path = (getattr(entry, "cfg", None) or {}).get("dataset_path")
    return f"It reads dataset_path={path!r}. " if path else ""


def evaluate(lm, names: list[str], tm, num_fewshot=None, limit=None) -> dict:
    """simple_evaluate with the TaskManager load_tasks returned (checked once, for every checkpoint)."""
    import lm_eval
    return lm_eval.simple_evaluate(model=lm, tasks=list(names), num_fewshot=num_fewshot, limit=limit,
                                   task_manager=tm, log_samples=False, bootstrap_iters=1000)


def columns(results: dict) -> dict[str, float]:
    """One row of seed 004 Table 3: the headline metric(s) per task (accuracies in %), and Avg = the mean over tasks of
    each task's first accuracy. Tasks outside the seed's set show whichever of GENERIC they report."""
    row, accs = {}, []
    for task, metrics in results["results"].items():
        values = {k.split(",")[0]: v for k, v in metrics.items()
                  if "," in k and "stderr" not in k and isinstance(v, (int, float))}
        shown = [m for m in SEED_TASKS.get(task) or GENERIC if m in values] or sorted(values)
        for m in shown:
            row[f"{task} {m}"] = 100 * values[m] if _is_accuracy(m) else values[m]
        first = next((m for m in shown if _is_accuracy(m)), None)
        if first:
            accs.append(100 * values[first])
    if accs:
        row["avg acc"] = sum(accs) / len(accs)
    return row


def _is_accuracy(metric: str) -> bool:
    return metric.startswith("acc") or metric == "exact_match"


def markdown_table(rows: dict[str, dict[str, float]]) -> str:
    """rows: model name -> columns(). Perplexities with 2 decimals, accuracies (%) with 1."""
    cols = list(dict.fromkeys(c for r in rows.values() for c in r))
    lines = ["| model | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, r in rows.items():
        cells = ["" if c not in r or r[c] is None or (isinstance(r[c], float) and math.isnan(r[c]))
                 else f"{r[c]:.2f}" if "perplexity" in c else f"{r[c]:.1f}" for c in cols]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    """lm-eval's own CLI, with this repo's model type registered (`import duality.hf`) and the batched scorer as
    `--model hf-batched` (HFLM's arguments and results)."""
    import duality.hf  # noqa: F401  (registers model_type "duality" with AutoConfig / AutoModelForCausalLM)
    from lm_eval.__main__ import cli_evaluate
    from lm_eval.api.registry import register_model
    register_model("hf-batched")(batched_hflm())
    sys.argv = [sys.argv[0], *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()


if __name__ == "__main__":
    main()
