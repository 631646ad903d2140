"""lm-evaluation-harness on any checkpoint of this repo: the model registered as lm_eval model "duality".

    loglikelihood(context, continuation)   log p(continuation | context) = sum_t log p(c_t | context, c_<t), and
                                           whether greedy decoding reproduces the continuation
    loglikelihood_rolling(text)            log p(text | <eot>) over windows of max_length tokens: every token is
                                           predicted once, with as much context as fits (lm_eval's rolling windows)
    generate_until(context, gen_kwargs)    decoding through the model's KV cache / recurrent state, cut at the first
                                           `until` string, end-of-text or max_gen_toks

Scoring batches: requests sorted longest first, right-padded to a multiple of 64 tokens (every mixer is causal, so
padding after a sequence never changes its scores, and Triton kernels see few distinct shapes); generation batches prompts of equal token length (a recurrent state cannot skip left
padding). Text is split as the harness's HF model does: the context's trailing spaces move to the continuation,
and the continuation's tokens are those of encode(context + continuation) after encode(context).

    python eval.py ckpt=RUN mode=lm_eval                                   # seed 004's task set + wikitext
    python eval.py ckpt=RUN mode=lm_eval 'lm_eval.tasks=[my_task]' lm_eval.include_path=my_tasks/

Offline: a task whose dataset is neither cached nor reachable fails before any scoring, naming the task and its
dataset. Only local task folders (include_path) are indexed when every requested task is found there; the
harness's ~15,000 built-in tasks are indexed (~20 s) only when needed.
"""

from __future__ import annotations

import difflib
import math
from contextlib import nullcontext
from functools import lru_cache

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from model.gpt import varying_shapes
from model import ConfigError

# seed 004 Table 3 (the GLA / DeltaNet task set) and wikitext perplexity; the metric each column shows
SEED_TASKS = {"lambada_openai": ("perplexity", "acc"), "piqa": ("acc",), "hellaswag": ("acc_norm",),
              "winogrande": ("acc",), "arc_easy": ("acc",), "arc_challenge": ("acc_norm",),
              "wikitext": ("word_perplexity",)}
GENERIC = ("acc", "acc_norm", "exact_match", "perplexity", "word_perplexity")


@register_model("duality")
class DualityLM(LM):
    def __init__(self, model, tokenizer, *, batch_size: int = 16, max_length: int | None = None, device=None,
                 progress: bool = True):
        super().__init__()
        if model.decoder is not None:
            raise ConfigError("mode=lm_eval needs a language model; this checkpoint has model.head=compress")
        self.model, self.tok = model.eval(), tokenizer
        self.batch_size = int(batch_size)
        self.max_length = int(max_length or model.cfg.seq_len)
        self._device = device or next(model.parameters()).device
        self.progress = progress
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if self._device.type == "cuda"
                         else nullcontext())

    @classmethod
    def create_from_arg_string(cls, arg_string, additional_config=None):
        """`lm_eval --model duality --model_args ckpt=RUN,batch_size=32` (after importing this module)."""
        from trainer.checkpoint import load_model
        args = dict(kv.split("=", 1) for kv in arg_string.split(",") if kv)
        args.update({k: v for k, v in (additional_config or {}).items() if v is not None and k != "device"})
        device = torch.device(args.pop("device", "cuda" if torch.cuda.is_available() else "cpu"))
        model, tok, _ = load_model(args.pop("ckpt"), device)
        return cls(model, tok, batch_size=int(args.pop("batch_size", 16)), max_length=args.pop("max_length", None),
                   device=device)

    @property
    def eot_token_id(self):
        return self.tok.eot_id

    # ---- scoring -----------------------------------------------------------------------------------------------
    def _split(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        if not context:
            return [self.tok.eot_id], self.tok.encode(continuation)
        n_space = len(context) - len(context.rstrip(" "))
        if n_space:
            context, continuation = context[:-n_space], context[-n_space:] + continuation
        whole, ctx = self.tok.encode(context + continuation), self.tok.encode(context)
        return ctx, whole[len(ctx):]

    @torch.no_grad()
    def score(self, pairs: list[tuple[list[int], list[int]]], desc: str = "loglikelihood") -> list[tuple[float, bool]]:
        """(context ids, continuation ids) -> (sum of the continuation's log-probs, is it the greedy decoding).
        Inputs longer than max_length keep their last max_length tokens."""
        L = self.max_length
        order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i][0]) - len(pairs[i][1]))
        out: list = [None] * len(pairs)
        for start in tqdm(range(0, len(order), self.batch_size), desc=desc, disable=not self.progress,
                          unit="batch"):
            rows = order[start:start + self.batch_size]
            seqs = [(pairs[i][0] + pairs[i][1])[-(L + 1):] for i in rows]  # inputs seq[:-1], targets seq[1:]
            n_cont = [min(len(pairs[i][1]), len(s) - 1) for i, s in zip(rows, seqs)]
            T = max(map(len, seqs)) - 1
            T = max(T, min(L, -(-T // 64) * 64))  # lengths in steps of 64: few distinct shapes for the kernels
            x = torch.full((len(rows), T), self.tok.eot_id, dtype=torch.long)
            y = torch.full((len(rows), T), -1, dtype=torch.long)  # -1: not a continuation token
            for r, (s, c) in enumerate(zip(seqs, n_cont)):
                x[r, :len(s) - 1] = torch.tensor(s[:-1])
                y[r, len(s) - 1 - c:len(s) - 1] = torch.tensor(s[-c:])
            x, y = x.to(self._device), y.to(self._device)
            with self.autocast, varying_shapes():
                logits, _ = self.model(x)
            rows_at, pos_at = (y >= 0).nonzero(as_tuple=True)  # only continuation positions get a softmax
            target = y[rows_at, pos_at]
            logp = torch.empty(len(target), device=x.device, dtype=torch.float64)
            greedy = torch.empty(len(target), device=x.device, dtype=torch.bool)
            for a in range(0, len(target), 8192):  # bounds the fp32 copy of the logits
                sel = logits[rows_at[a:a + 8192], pos_at[a:a + 8192]]
                lp = F.log_softmax(sel.to(torch.promote_types(sel.dtype, torch.float32)), -1)
                logp[a:a + 8192] = lp.gather(-1, target[a:a + 8192, None])[:, 0]
                greedy[a:a + 8192] = lp.argmax(-1) == target[a:a + 8192]
            ll = torch.zeros(len(rows), device=x.device, dtype=torch.float64).index_add_(0, rows_at, logp)
            miss = torch.zeros(len(rows), device=x.device, dtype=torch.long).index_add_(0, rows_at, (~greedy).long())
            for i, v, m in zip(rows, ll.tolist(), miss.tolist()):
                out[i] = (v, m == 0)
        return out

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        return self.score([self._split(*r.args) for r in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        windows, owner = [], []
        for n, r in enumerate(requests):
            for w in get_rolling_token_windows(self.tok.encode(r.args[0]), self.tok.eot_id, self.max_length, 1):
                windows.append(make_disjoint_window(w))
                owner.append(n)
        total = [0.0] * len(requests)
        for n, (ll, _) in zip(owner, self.score(windows, "loglikelihood_rolling")):
            total[n] += ll
        return total

    # ---- generation --------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False):
        groups: dict = {}
        for n, r in enumerate(requests):
            context, kw = r.args
            kw = dict(kw or {})
            until = kw.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kw.get("max_gen_toks", 256))
            temp = float(kw.get("temperature", 0.0)) if kw.get("do_sample") else 0.0
            ids = (self.tok.encode(context) or [self.tok.eot_id])[-max(1, self.max_length - max_new):]
            groups.setdefault((len(ids), tuple(until), max_new, temp), []).append((n, ids))
        out: list = [None] * len(requests)
        batches = [(key, items[i:i + self.batch_size]) for key, items in groups.items()
                   for i in range(0, len(items), self.batch_size)]
        for (_, until, max_new, temp), items in tqdm(batches, desc="generate_until", disable=not self.progress,
                                                     unit="batch"):
            prompt = torch.tensor([ids for _, ids in items], device=self._device)

            def done(new):  # every row has produced end-of-text or a stop string
                return all(self.tok.eot_id in row or any(s in self.tok.decode(row) for s in until)
                           for row in new.tolist())

            with self.autocast:
                seq = self.model.generate(prompt, max_new, temperature=temp, stop=done)
            for (n, _), row in zip(items, seq[:, prompt.shape[1]:].tolist()):
                if self.tok.eot_id in row:
                    row = row[:row.index(self.tok.eot_id)]
                text = self.tok.decode(row)
                for s in until:
                    text = text.split(s)[0] if s else text
                out[n] = text
        return out


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
                f"(HF_DATASETS_CACHE); or point a task YAML at local JSONL files (README, Evaluation)") from None
    return tm


def _dataset_hint(entry) -> str:
    path = (getattr(entry, "cfg", None) or {}).get("dataset_path")
    return f"It reads dataset_path={path!r}. " if path else ""


def evaluate(lm: DualityLM, names: list[str], tm, num_fewshot=None, limit=None) -> dict:
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
