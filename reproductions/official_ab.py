"""Seed 004's own code beside this repo: S2 data in its format, its training run observed, one record, one figure.
(Over 500 lines: the data writer, the observer of the seed's run and the comparison are one procedure.)

The seed's code (timurcarstensen/selective-rope) is never copied here: `reproductions/official_ab.sh` fetches it into a
git-ignored folder and runs it through this file, which only writes its data and watches its evaluations.

    python reproductions/official_ab.py data DIR [--train 2000000] [--test 2000] [--seed 0]
    python reproductions/official_ab.py run SRC OUT_DIR --seed S [hydra overrides of the seed's main.py ...]
    python reproductions/official_ab.py record --seed-runs DIR... --repo-runs DIR... --out docs/synthetic/X.json
    python reproductions/official_ab.py record --into X.json --call LABEL --device D --seed-runs DIR... --suffix -LABEL
    python reproductions/official_ab.py plot X.json --out docs/synthetic/X.png

`data` writes S2=128.csv and S2=512.csv as the seed's `generate_data.py --group S2 --samples N --seed S` does: the
same sampling (random.seed(S), `random.choices` of k tokens into a set until N distinct, the set's order), the same
columns (seed,input,target), the target at t the running product of the first t elements of S2. abstract_algebra
lists S2 as [identity, swap], so element 1 is the swap and the product is the running XOR; the seed's loop computes
it one group operation at a time (about 6 minutes for 2M rows of 128), numpy does it at once.

`run` calls the seed's `state_tracking.main.train` (its Hydra app, its data loading, model, optimiser, schedule and
loop, unchanged) with two observers: every training batch's metrics call counts a step, and every evaluation's
predictions are scored per length into OUT_DIR/evals.jsonl: the share of positions right at length L (1-512) and
the share of sequences right at every position up to L (the seed's own `sequence_accuracies`, without <bos>).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

TRAIN_LEN, TEST_LEN = 128, 512
TRAIN_EVERY = 50  # steps between the observer's rows of training loss and accuracy


# ------------------------------------------------------------------------------------------------------- data
def sample_sequences(n: int, k: int, seed: int) -> list[tuple[int, ...]]:
    """generate_data.py's sampling for S2: n distinct k-tuples of {0, 1}, in the order of the set that holds them."""
    random.seed(seed)
    seqs: set[tuple[int, ...]] = set()
    while len(seqs) < n:
        seqs.add(tuple(random.choices(range(2), k=k)))
    return list(seqs)


def running_product(seqs: np.ndarray) -> np.ndarray:
    """S2's word problem: the target at t is the product of the first t elements; with 0 the identity and 1 the
    swap it is the running XOR."""
    return np.bitwise_xor.accumulate(seqs, axis=1)


def write_csv(path: Path, n: int, k: int, seed: int) -> None:
    seqs = np.array(sample_sequences(n, k, seed), dtype=np.uint8)
    targets = running_product(seqs)
    # each row as bytes at once: "seed," then the k digits of x and of y, each followed by a space, a comma or a
    # newline (a Python join per row took most of a minute for 2M rows)
    n, head = len(seqs), f"{seed},".encode()
    row = np.empty((n, len(head) + 4 * k), dtype=np.uint8)
    row[:, :len(head)] = np.frombuffer(head, dtype=np.uint8)
    body = row[:, len(head):].reshape(n, 2, k, 2)
    body[:, 0, :, 0], body[:, 1, :, 0] = seqs + ord("0"), targets + ord("0")
    body[:, :, :, 1] = ord(" ")
    body[:, 0, -1, 1], body[:, 1, -1, 1] = ord(","), ord("\n")
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(b"seed,input,target\n")
        f.write(row.tobytes())
    tmp.replace(path)


def cmd_data(a) -> None:
    out = Path(a.dir)
    out.mkdir(parents=True, exist_ok=True)
    for k, n, seed in ((TRAIN_LEN, a.train, a.seed), (TEST_LEN, a.test, a.seed + 1)):
        t = time.time()
        write_csv(out / f"S2={k}.csv", n, k, seed)
        print(f"S2={k}.csv: {n} rows, seed {seed}, {time.time() - t:.0f} s", flush=True)


# ------------------------------------------------------------------------------------------------ observation
def per_length(pred: np.ndarray, target: np.ndarray) -> tuple[list[float], list[float], list[int]]:
    """Right answers per position and whole-prefix correctness, summed over sequences: (right at L, prefix right
    to L, count) for L = 1..len. Position 0 (the <bos> label) is left out, as this repo scores."""
    right = pred[:, 1:] == target[:, 1:]
    prefix = np.cumprod(right, axis=1)
    return right.sum(0).tolist(), prefix.sum(0).tolist(), [len(right)] * right.shape[1]


class Observer:
    """Counts the seed's training steps and scores its evaluations per length, without changing either."""

    def __init__(self, out: Path):
        self.out, self.step, self.t0 = out, 0, time.time()
        self.right = self.prefix = self.count = None

    def wrap_compute(self, compute):
        def compute_metrics(data, *args, prefix=None, **kw):
            if prefix == "train":
                self.step += 1
                if self.step % TRAIN_EVERY == 0:  # the batch just trained on, scored as this repo logs
                    self.train_row(*data)
            elif prefix == "val":
                for logits, target in (data if isinstance(data, list) else [data]):
                    r, p, c = per_length(logits.argmax(-1).cpu().numpy(), target.cpu().numpy())
                    if self.right is None:
                        self.right, self.prefix, self.count = r, p, c
                    else:
                        self.right = [a + b for a, b in zip(self.right, r)]
                        self.prefix = [a + b for a, b in zip(self.prefix, p)]
                        self.count = [a + b for a, b in zip(self.count, c)]
            return compute(data, *args, prefix=prefix, **kw)
        return compute_metrics

    def train_row(self, logits, target) -> None:
        import torch.nn.functional as F
        logits, target = logits[:, 1:].float(), target[:, 1:]
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten()).item()
        acc = (logits.argmax(-1) == target).float().mean().item()
        with open(self.out / "train.jsonl", "a") as f:
            f.write(json.dumps({"step": self.step, "wall_s": round(time.time() - self.t0, 1), "loss": loss,
                                "acc": acc}) + "\n")

    def wrap_reduce(self, reduce):
        def reduce_metrics(values):
            out = reduce(values)
            if any(k.startswith("val/") for k in out) and self.right is not None:
                self.write({"step": self.step, "wall_s": round(time.time() - self.t0, 1),
                            "val_loss": float(out["val/loss"]),
                            "curve": [r / c for r, c in zip(self.right, self.count)],
                            "curve_seq": [p / c for p, c in zip(self.prefix, self.count)]})
                self.right = self.prefix = self.count = None
            return out
        return reduce_metrics

    def write(self, row: dict) -> None:
        row.update(summarise(row["curve"], row["curve_seq"]))
        with open(self.out / "evals.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[observer] step {row['step']}: acc<=128 {row['val_acc']:.4f} acc 129-512 "
              f"{row['val_acc_extrap']:.4f} all right to 128 {row['val_seq_acc']:.4f}", flush=True)


def summarise(curve: list[float], curve_seq: list[float]) -> dict:
    """This repo's summary numbers (data/tasks/__init__.py: evaluate) from curves indexed by length - 1."""
    c = np.asarray(curve)
    out = {"val_acc": float(c[:TRAIN_LEN].mean()), "val_acc_extrap": float(c[TRAIN_LEN:].mean()),
           "val_seq_acc": float(curve_seq[TRAIN_LEN - 1]), "val_seq_acc_extrap": float(curve_seq[-1])}
    for end in range(64, len(c) + 1, 64):  # log_points' buckets (L - 64, L]
        out[f"val_acc@{end}"] = float(c[end - 64:end].mean())
    return out


def stand_ins() -> dict:
    """Two of the seed's imports that a device call cannot carry (no network there, 64 MiB a call), replaced by
    what the S2 path uses of them, no more:
    - wandb: with trainer.logging=false no run is made, but main.py still builds wandb.Table and wandb.plot.line
      after each evaluation and calls wandb.finish at the end; here they do nothing;
    - polars (a 54 MB runtime): get_dataset reads it once, to list the distinct input tokens of the training CSV
      (`pl.read_csv(p).select(pl.col("input").map_batches(split on " ")).explode("input").unique()["input"]
      .to_list()`); here the csv module does that.
    They are seen by main.py alone, where the real package is missing: datasets and accelerate are imported first,
    so their own checks for polars and wandb still find what is installed."""
    import csv
    import importlib.machinery
    import types

    wandb = types.ModuleType("wandb")
    wandb.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # accelerate probes find_spec("wandb")
    wandb.Table = lambda *a, **k: None
    wandb.plot = types.SimpleNamespace(line=lambda *a, **k: None)
    wandb.alert = wandb.log = wandb.finish = lambda *a, **k: None

    class Frame:  # the one chain get_dataset calls, over the "input" column
        def __init__(self, path=None, tokens=None):
            self.path, self.tokens = path, tokens

        def select(self, _column):
            with open(self.path, newline="") as f:
                return Frame(tokens=[row["input"].split(" ") for row in csv.DictReader(f)])

        def explode(self, _name):
            return Frame(tokens=[t for row in self.tokens for t in row])

        def unique(self):
            return Frame(tokens=sorted(set(self.tokens)))

        def __getitem__(self, _name):
            return self

        def to_list(self):
            return list(self.tokens)

    polars = types.ModuleType("polars")
    polars.__spec__ = importlib.machinery.ModuleSpec("polars", None)
    polars.read_csv = lambda path: Frame(path=path)
    polars.col = lambda name: types.SimpleNamespace(map_batches=lambda f: name)
    return {"wandb": wandb, "polars": polars}


def import_seed_module(src: Path, task: str, names=("wandb", "polars")):
    """The seed's synthetic_tasks/<task> main.py as a module: this repo's shipped FLA kernel configs seeded where it
    is importable (first steps in seconds, not minutes), and stand-ins for `names` (stand_ins) that are not
    installed, seen by main.py alone."""
    import importlib
    sys.path[:0] = [str(src / "src"), str(src / f"synthetic_tasks/{task}/src")]
    try:
        import duality.kernels.tuned_configs  # noqa: F401
    except ImportError:
        pass
    import accelerate  # noqa: F401  (before the stand-ins: see stand_ins)
    missing, stand = {}, stand_ins()
    for name in names:
        try:
            __import__(name)
        except ImportError:
            missing[name] = sys.modules[name] = stand[name]
    seed_main = importlib.import_module(f"{task}.main")
    for name in missing:
        del sys.modules[name]
    if missing:
        print(f"[official_ab] stand-ins for {', '.join(missing)} (not installed)", flush=True)
    return seed_main


def import_seed_main(src: Path):
    """The seed's state_tracking/main.py as a module, with what this machine's packages need (stand_ins, and the
    token_type_ids column: main.py removes it after tokenizing, and transformers 5's tokenizers no longer return
    it; an all-zero column, dropped at once, keeps main.py's code as it is)."""
    import logging
    import os
    os.chdir(src)  # the seed's main finds its configs through the git repository around the working directory
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    import datasets  # noqa: F401  (before the stand-ins: datasets probes polars)
    seed_main = import_seed_module(src, "state_tracking")
    tokenize = seed_main.tokenize

    def tokenize_with_type_ids(example, tokenizer, supervised):
        out = tokenize(example, tokenizer=tokenizer, supervised=supervised)
        if "token_type_ids" not in out:
            out["token_type_ids"] = out["input_ids"] * 0
        return out
    seed_main.tokenize = tokenize_with_type_ids
    return seed_main


def cmd_prep(a) -> None:
    """Tokenize the seed's CSVs once into datasets' cache, with N processes, as main.py's get_dataset does (the same
    function and arguments, so the runs find it cached): one process took 385 s for 2M rows on a 2-core machine,
    most of a 10-minute device call, and each run would pay it."""
    import datasets
    src = Path(a.src).resolve()
    seed_main = import_seed_main(src)
    seed_main.log = __import__("logging").getLogger("official_ab")
    plain_map = datasets.Dataset.map
    datasets.Dataset.map = lambda self, *args, **kw: plain_map(self, *args, **{"num_proc": a.procs, **kw})
    for k in (TRAIN_LEN, TEST_LEN):
        t = time.time()
        d = seed_main.get_dataset(group="S2", k=k, strict_len=True, train_size=1.0, data_dir=Path(a.data).resolve(),
                                  supervised=True, max_samples=None)
        print(f"S2={k}: {d['dataset'].num_rows} rows tokenized in {time.time() - t:.0f} s", flush=True)


def cmd_warm(a, overrides: list[str]) -> None:
    """Compile the seed's model's kernels into Triton's cache while the data is made: a step at the training shape
    and the evaluation's two forward passes (2,000 test rows at batch 1,024), on random tokens. The runs then start
    in seconds instead of the 4-5 minutes their first step took (FLA autotunes every kernel at a new shape)."""
    import json as _json
    import tempfile

    import torch
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from transformers import AutoConfig, AutoModelForCausalLM
    src = Path(a.src).resolve()
    import_seed_main(src)
    with initialize_config_dir(version_base=None, config_dir=str(src / "configs/state_tracking")):
        cfg = compose(config_name="state_tracking", overrides=[o for o in overrides if not o.startswith("data.")])
    cfg.model.vocab_size = 9  # S2's two tokens and main.py's seven special ones
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "config.json").write_text(_json.dumps(OmegaConf.to_container(cfg.model, resolve=True)))
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp + "/config.json"))
    model = model.to(torch.bfloat16).to("cuda")
    t = time.time()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        x = torch.randint(0, 9, (1024, TRAIN_LEN + 1), device="cuda")
        torch.nn.functional.cross_entropy(model(x).logits.flatten(0, 1), x.flatten()).backward()
        with torch.no_grad():
            for rows in (1024, 2000 - 1024):
                model(torch.randint(0, 9, (rows, TEST_LEN + 1), device="cuda"))
    torch.cuda.synchronize()
    print(f"warm: kernels ready in {time.time() - t:.0f} s", flush=True)


def cmd_run(a, overrides: list[str]) -> None:
    src, out = Path(a.src).resolve(), Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    seed_main = import_seed_main(src)
    from accelerate.logging import get_logger
    seed_main.log = get_logger(seed_main.__name__)  # main.py defines `log` only when run as a script
    obs = Observer(out)
    seed_main.compute_metrics = obs.wrap_compute(seed_main.compute_metrics)
    seed_main.reduce_metrics = obs.wrap_reduce(seed_main.reduce_metrics)
    sys.argv = ["main.py", "hydra.mode=RUN", f"hydra.run.dir={out}/hydra", f"trainer.seed={a.seed}", *overrides]
    (out / "command.txt").write_text(" ".join(sys.argv) + "\n")
    seed_main.train()


# ----------------------------------------------------------------------------------------------- record, plot
def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def repo_run(run: Path) -> dict:
    """A repo run's training rows (loss every log_interval) and evaluations (metrics.jsonl rows with val_acc)."""
    rows = read_jsonl(run / "metrics.jsonl")
    return {"train": [{"step": r["step"], "loss": r["loss"]} for r in rows if "loss" in r and "val_acc" not in r],
            "evaluations": [{k: v for k, v in r.items() if k == "step" or k.startswith("val_")}
                            for r in rows if "val_acc" in r]}


def seed_run(run: Path) -> dict:
    """The observer's rows of a run of the seed's code: training batches (loss and accuracy over positions 1-128 of
    the batch about to be trained on) and evaluations (per-length curves, summarised as this repo's)."""
    evals = read_jsonl(run / "evals.jsonl")
    out = {"train": read_jsonl(run / "train.jsonl"),
           "evaluations": [{k: v for k, v in e.items() if not k.startswith("curve")} for e in evals]}
    if evals:
        out["final"] = {k: evals[-1][k] for k in ("step", "curve", "curve_seq")}
    return out


def cmd_record(a) -> None:
    """A new record, or (--into) an existing one with more runs; --call and --device are kept with each added run,
    --suffix is added to their names, and --from-record adds a seed_spread record's runs as this repo's."""
    rec = json.loads(Path(a.into).read_text()) if a.into else {
        "device": a.device, "date": a.date, "software": a.software, "note": a.note, "seed_code": {}, "repo": {}}
    added = [("seed_code", Path(r).name, seed_run(Path(r))) for r in a.seed_runs]
    added += [("repo", Path(r).name, repo_run(Path(r))) for r in a.repo_runs]
    for path in a.from_record:
        added += [("repo", name, {"train": [], "evaluations": run["evaluations"]})
                  for name, run in json.loads(Path(path).read_text())["runs"].items()]
    for side, name, run in added:
        name += a.suffix
        if name in rec[side]:
            sys.exit(f"{name} is already in the record: give the added runs a --suffix")
        if a.into:
            run.update({k: v for k, v in (("call", a.call), ("device", a.device)) if v})
        rec[side][name] = run
    out = a.out or a.into
    Path(out).write_text(json.dumps(rec, indent=1))
    print(f"wrote {out}: {len(rec['seed_code'])} runs of the seed's code, {len(rec['repo'])} of this repo")


def first_fit(rows: list[dict], key: str = "acc", level: float = 0.99) -> int | None:
    """The first step whose accuracy over positions 1-128 reached `level`."""
    return next((r["step"] for r in rows if r.get(key) is not None and r[key] >= level), None)


def fit_of(side: str, run: dict) -> int | None:
    """When a run first had >= 99% of positions 1-128 right: the seed's code's training batches (every 50 steps,
    unseen in epoch 1), this repo's evaluations (every 500)."""
    return first_fit(run["train"]) if side == "seed_code" else first_fit(run["evaluations"], "val_acc")


def group_of(side: str, name: str) -> str | None:
    """The setting a run belongs to in the fits table (None: not compared there)."""
    if "nope" in name:
        return None
    if side == "seed_code":
        return "the seed's code (bf16 weights, its init)"
    if name.endswith("-bf16w"):
        return "this repo, the seed's precision and init"
    return "this repo, default (fp32 weights)"


def fisher_greater(a: int, n1: int, b: int, n2: int) -> float:
    """One-sided Fisher exact p: the chance of a or more of the K = a + b fits landing in the first n1 runs."""
    from math import comb
    k = a + b
    return sum(comb(n1, x) * comb(n2, k - x) for x in range(a, min(n1, k) + 1)) / comb(n1 + n2, k)


def fits(rec: dict, budgets=(2000, 3500), slack: int = 150) -> dict:
    """Per setting and budget B: of the runs that ran to step B, those that fitted length 128 by then; and each
    fitted run's first evaluation from its fit on: accuracy <= 128, on 129-512, sequences right to 512. A run that
    stopped at most `slack` steps short of B counts with the fit it had (the seed's code's runs end at 1,950 and
    3,350, this repo's are evaluated every 500 steps): that leans against the seed's code, never towards it."""
    out = {}
    for side in ("seed_code", "repo"):
        for name, run in sorted(rec[side].items()):
            group = group_of(side, name)
            if group is None:
                continue
            g = out.setdefault(group, {"runs": [], **{b: [0, 0] for b in budgets}, "after_fit": []})
            fit, steps = fit_of(side, run), [r["step"] for r in run["train"] + run["evaluations"]]
            g["runs"].append(name)
            for b in budgets:
                if max(steps) >= b - slack:
                    g[b][0] += fit is not None and fit <= b
                    g[b][1] += 1
            ev = next((e for e in run["evaluations"] if fit is not None and e["step"] >= fit and e["val_acc"] >= .99),
                      None)
            if ev:
                g["after_fit"].append((name, ev))
    return out


def fits_table(rec: dict, budgets=(2000, 3500)) -> str:
    """Markdown: the fits per setting and budget, each fitted run's extrapolation, and Fisher's p of the seed's code
    against this repo's runs together."""
    f = fits(rec, budgets)
    lines = ["| setting | runs in the record | " + " | ".join(f"fitted 128 by step {b:,}" for b in budgets) +
             " | each fitted run's first evaluation at ≥ 99%: step, ≤ 128 / 129–512 / sequences right to 512 |",
             "|---|---:|" + "---:|" * len(budgets) + "---|"]
    for group, g in f.items():
        after = "; ".join(f"{e['step']:,}: {100 * e['val_acc']:.1f} / {100 * e['val_acc_extrap']:.1f} / "
                          f"{100 * e.get('val_seq_acc_extrap', 0):.0f}%" for _, e in g["after_fit"]) or "none evaluated"
        lines.append(f"| {group} | {len(g['runs'])} | " + " | ".join(f"{g[b][0]} of {g[b][1]}" for b in budgets) +
                     f" | {after} |")
    seed = [g for k, g in f.items() if k.startswith("the seed's")]
    repo = [g for k, g in f.items() if k.startswith("this repo")]
    if seed and repo:
        ps = []
        for b in budgets:
            a, n1 = seed[0][b]
            rb, n2 = sum(g[b][0] for g in repo), sum(g[b][1] for g in repo)
            if n1 and n2:
                ps.append(f"by step {b:,}, {a} of {n1} against {rb} of {n2}: p = {fisher_greater(a, n1, rb, n2):.2f}")
        lines.append("\nThe seed's code fitting more often than this repo's runs together (one-sided Fisher exact "
                     "test): " + "; ".join(ps) + ".")
    return "\n".join(lines)


def table(rec: dict) -> str:
    """Markdown, a row a run: steps trained, the training loss at its lowest and at its end (mean of the last 5
    rows), when positions 1-128 were first >= 99% right, and the last evaluation where there is one."""
    lines = ["| code | run | steps | lowest training loss | training loss, last 5 rows | first ≥ 99% ≤ 128 | "
             "last evaluation: acc ≤ 128 / 129–512 |", "|---|---|---:|---:|---:|---:|---|"]
    for side, label in (("seed_code", "seed's code"), ("repo", "this repo")):
        for name, run in sorted(rec[side].items()):
            tr, ev = run["train"], run["evaluations"]
            if not tr:
                continue
            fit = fit_of(side, run)
            last = (f"{100 * ev[-1]['val_acc']:.1f}% / {100 * ev[-1]['val_acc_extrap']:.1f}% (step {ev[-1]['step']:,})"
                    if ev else "none (stopped before its first)")
            tail = np.mean([r["loss"] for r in tr[-5:]])
            lines.append(f"| {label} | {name} | {tr[-1]['step']:,} | {min(r['loss'] for r in tr):.4f} | {tail:.4f} | "
                         f"{f'{fit:,}' if fit else 'not reached'} | {last} |")
    return "\n".join(lines)


def fitted_share(rec: dict, group: str, steps: np.ndarray) -> np.ndarray:
    """At each step s, the share of the group's runs that ran to s which had fitted length 128 by s (NaN where
    fewer than 3 ran that far)."""
    runs = [(fit_of(side, run), max(r["step"] for r in run["train"] + run["evaluations"]))
            for side in ("seed_code", "repo") for name, run in rec[side].items() if group_of(side, name) == group]
    out = []
    for s in steps:
        alive = [f for f, last in runs if last >= s]
        out.append(np.mean([f is not None and f <= s for f in alive]) if len(alive) >= 3 else np.nan)
    return 100 * np.asarray(out, dtype=float)


def cmd_plot(a) -> None:
    """Four panels: the share of runs fitted by each step per setting; accuracy on lengths <= 128 over training;
    accuracy per length and sequences right to each length at every fitted run's first evaluation from its fit."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    rec = json.loads(Path(a.record).read_text())
    look = {"the seed's code (bf16 weights, its init)": ("tab:red", "-"),
            "this repo, default (fp32 weights)": ("tab:blue", "-"),
            "this repo, the seed's precision and init": ("tab:cyan", "--")}
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    last = max(r["step"] for side in ("seed_code", "repo") for run in rec[side].values()
               for r in run["train"] + run["evaluations"])
    steps = np.arange(0, last + 1, 50)
    for group, (color, style) in look.items():
        axes[0, 0].plot(steps, fitted_share(rec, group, steps), style, color=color, lw=1.5)
    for side in ("seed_code", "repo"):
        for name, run in sorted(rec[side].items()):
            group = group_of(side, name)
            color, style = look[group] if group else ("gray", ":")
            if side == "seed_code":  # the batch about to be trained on: unseen data in the first epoch
                axes[0, 1].plot([r["step"] for r in run["train"]], [100 * r["acc"] for r in run["train"]], style,
                                color=color, lw=0.6, alpha=0.7)
            else:
                ev = run["evaluations"]
                axes[0, 1].plot([e["step"] for e in ev], [100 * e["val_acc"] for e in ev], style, color=color,
                                lw=0.8, marker="o", markersize=2)
    for group, g in fits(rec).items():
        color, style = look[group]
        for name, ev in g["after_fit"]:
            run = rec["seed_code"].get(name) or rec["repo"][name]
            fin = run.get("final")
            if fin and fin["step"] == ev["step"]:  # the seed's code: every length
                lengths = np.arange(1, len(fin["curve"]) + 1)
                axes[1, 0].plot(lengths, 100 * np.asarray(fin["curve"], dtype=float), style, color=color, lw=1)
                axes[1, 1].plot(lengths, 100 * np.asarray(fin["curve_seq"], dtype=float), style, color=color, lw=1)
            else:  # this repo's evaluations: every 64th length
                at = sorted(int(k[8:]) for k in ev if k.startswith("val_acc@"))
                axes[1, 0].plot(at, [100 * ev[f"val_acc@{n}"] for n in at], style, color=color, marker="o", lw=1)
    axes[0, 0].set(title="runs that had fitted length 128 (≥ 99% of positions right), of those run that far",
                   ylabel="%", ylim=(-2, 102))
    axes[0, 1].set(title="positions right, lengths ≤ 128 (seed's code: training batches; this repo: test set)",
                   ylim=(40, 102))
    axes[1, 0].set(title="positions right at length L, each fitted run's first evaluation from its fit",
                   xlabel="length L", ylim=(40, 102))
    axes[1, 1].set(title="sequences right to length L (the seed's code's fitted run)", xlabel="length L",
                   ylim=(-2, 102))
    for ax in axes.flat:
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3)
    for ax in axes[0]:
        ax.set_xlabel("step")
    for ax in axes[1]:
        ax.axvline(TRAIN_LEN, color="gray", linestyle="--", linewidth=1)
    handles = [Line2D([], [], color=c, ls=st, label=g) for g, (c, st) in look.items()]
    handles.append(Line2D([], [], color="gray", ls=":", label="the seed's code, NoPE"))
    finish_figure(fig, handles, a.title, a.out)
    print(table(rec))
    print(fits_table(rec))


def finish_figure(fig, handles, title: str, out) -> None:
    """A figure of these A/Bs: the legend under its panels, the title over them, written whole or not at all."""
    from duality.common.io import atomic_path
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    with atomic_path(out, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110)
    print(f"wrote {out}")


def describe_record(parser) -> None:
    """A record's description: where, when and with what its runs ran."""
    parser.add_argument("--device", default="")
    parser.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    parser.add_argument("--software", default="")
    parser.add_argument("--note", default="")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="S2=128.csv and S2=512.csv in the seed's format")
    d.add_argument("dir")
    d.add_argument("--train", type=int, default=2_000_000)
    d.add_argument("--test", type=int, default=2000)
    d.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("run", help="the seed's state_tracking main.py, observed")
    r.add_argument("src")
    r.add_argument("out")
    r.add_argument("--seed", type=int, required=True)
    w = sub.add_parser("warm", help="compile the seed's model's kernels (Triton's cache) for the runs")
    w.add_argument("src")
    t = sub.add_parser("prep", help="tokenize the seed's CSVs once, in datasets' cache")
    t.add_argument("src")
    t.add_argument("data")
    t.add_argument("--procs", type=int, default=8)
    c = sub.add_parser("record", help="one JSON record of both sides' runs")
    c.add_argument("--seed-runs", nargs="*", default=[])
    c.add_argument("--repo-runs", nargs="*", default=[])
    c.add_argument("--from-record", nargs="*", default=[], help="a seed_spread record's runs, as this repo's")
    c.add_argument("--into", help="an existing record to add the runs to (written back unless --out)")
    c.add_argument("--call", default="", help="with --into: which call the added runs ran in")
    c.add_argument("--suffix", default="", help="added to the added runs' names")
    c.add_argument("--out")
    describe_record(c)
    f = sub.add_parser("plot", help="the record as one figure and a markdown table")
    f.add_argument("record")
    f.add_argument("--out", required=True)
    f.add_argument("--title", default="")
    a, rest = p.parse_known_args(argv)
    if a.cmd in ("run", "warm"):
        (cmd_run if a.cmd == "run" else cmd_warm)(a, rest)
    elif rest:
        p.error(f"unrecognised arguments: {' '.join(rest)}")
    elif a.cmd == "record" and not (a.out or a.into):
        p.error("record: --out or --into")
    else:
        {"data": cmd_data, "prep": cmd_prep, "record": cmd_record, "plot": cmd_plot}[a.cmd](a)


if __name__ == "__main__":
    main()
