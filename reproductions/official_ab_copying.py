"""Seed 004's own copying code beside this repo: its run observed and evaluated at this repo's lengths, one record,
one figure (docs/synthetic, "Seed 004's own code beside this repo: copying").

    python reproductions/official_ab_copying.py run SRC OUT_DIR --seed S --pe selective_rope|nope [--deadline UNIX]
    python reproductions/official_ab_copying.py record --seed-runs DIR... --repo-records X.json... --out Y.json
    python reproductions/official_ab_copying.py plot Y.json --out Y.png

`run` calls the seed's `copying.main.main` (timurcarstensen/selective-rope d12e825, synthetic_tasks/copying: its
data, model, optimiser, schedule and loop, unchanged) on the config its copying sweep would hand it, composed from
its configs/copying with the sweep's values. Its loop evaluates only after the last of its 5,000 steps, and a device
call (10 minutes) ends before that; so an observer, seeing the loop's own logging calls, evaluates its model every
EVERY steps with the seed's own evaluation data and scorer (EvalCopyDataset, _score_batch) at this repo's lengths,
64 strings a length, and stops the run after an evaluation when the next EVERY steps would not fit before
--deadline. The schedule stays the 5,000 steps' (a linear decay from 10% warmup), so step s here is step s of the
full run, as in this repo's evaluations every 500 steps of the same schedule.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from official_ab import describe_record, finish_figure, import_seed_module, read_jsonl  # noqa: E402

from duality.common.io import write_atomic  # noqa: E402

LENGTHS = (8, 16, 32, 64, 96, 128, 192, 256, 384, 512)  # this repo's copying evaluation (data/tasks/copying.py)
TRAIN_MAX = 64  # the longest training string
EVERY, EXAMPLES, EVAL_SEED = 500, 64, 1234
# the seed's copying sweep (configs/copying/copying.yaml), Selective RoPE as its config group gives it with the
# sweep's values over it; bias and phase gate off, as this repo's selective_rope_copy
SWEEP = ["trainer.lr=2e-3", "trainer.steps_budget=5000", "trainer.logging=false"]
SCHEMES = {"nope": ["model/position_embedding=nope"],
           "selective_rope": ["model/position_embedding=selective_rope", "model.position_embedding.skip_conv=true",
                              "model.position_embedding.temp_type=rfa", "model.position_embedding.temp_theta=0.9999",
                              "model.position_embedding.temp_max=0.25", "model.position_embedding.temp_grad=false",
                              "model.position_embedding.use_gate=false", "model.position_embedding.use_bias=false"]}


class Stop(Exception):
    """Raised from the observer to end a run after an evaluation, when the next would not fit the call."""


def copy_scores(x, pred, lengths) -> tuple[list[bool], list[float]]:
    """This repo's scoring of rows `$ s_1..s_L | s_1..s_L . * ...` (token ids, pred[t] the guess for x[t+1]): a
    string is copied when its L letters and the '.' after them are right; the letters' share right."""
    copied, letters = [], []
    for row, guess, n in zip(x.tolist(), pred.tolist(), lengths):
        want, got = row[n + 2:2 * n + 3], guess[n + 1:2 * n + 2]
        copied.append(want == got)
        letters.append(sum(a == b for a, b in zip(want[:n], got[:n])) / n)
    return copied, letters


class Observer:
    """Sees the seed's loop through its accelerator: the model it prepares and the metrics it logs."""

    def __init__(self, out: Path, seed_main, cfg, deadline: float | None):
        self.out, self.seed_main, self.cfg, self.deadline = out, seed_main, cfg, deadline
        self.model, self.t0, self.mark = None, time.time(), None  # mark: (step, time) after the setup
        self.sets = None

    def eval_sets(self) -> dict:
        """Fixed evaluation strings a length, drawn once by the seed's EvalCopyDataset from a fixed numpy state (its
        training data comes from the loader's workers, whose numpy states are their own)."""
        if self.sets is None:
            import torch
            d, state = self.cfg.data, np.random.get_state()
            np.random.seed(EVAL_SEED)
            tokenizer, to_token, _ = self.seed_main.get_tokenizer(d)
            self.tokenizer, self.sets = tokenizer, {}
            for n in LENGTHS:
                ds = self.seed_main.EvalCopyDataset(tokenizer, to_token, vocab_size=d.vocab_size, n_gram=d.n_gram,
                                                    length_answer=d.length_answer, eval_task=d.eval_task,
                                                    sequence_length=max(2 * n + 1, d.sequence_length),
                                                    min_length=n, max_length=n, num_examples=EXAMPLES)
                self.sets[n] = torch.stack([ds[i]["input_ids"] for i in range(EXAMPLES)])
            np.random.set_state(state)
        return self.sets

    def evaluate(self, step: int) -> dict:
        import torch
        model, device = self.model, next(self.model.parameters()).device
        model.eval()
        row = {"step": step, "wall_s": round(time.time() - self.t0, 1), "str": {}, "str_eos": {}, "char": {}}
        with torch.no_grad():
            for n, x in self.eval_sets().items():
                x = x.to(device)
                with torch.autocast("cuda" if device.type == "cuda" else "cpu", dtype=torch.bfloat16):
                    out = model(x)
                pred = getattr(out, "logits", out).argmax(-1)
                s_acc, c_acc = self.seed_main._score_batch(self.tokenizer, x, pred)  # the seed's own scorer
                copied, _ = copy_scores(x, pred, [n] * len(x))
                row["str"][n], row["char"][n], row["str_eos"][n] = s_acc, c_acc, float(np.mean(copied))
        model.train()
        with open(self.out / "evals.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[observer] step {step}: strings " + " ".join(f"{n}:{100 * v:.0f}" for n, v in row["str"].items()) +
              " | letters beyond 64 " + f"{100 * letters_beyond(row['char']):.1f}%", flush=True)
        return row

    def on_log(self, values: dict, step: int | None) -> None:
        if "train/loss" in values and step:
            self.mark = self.mark or (step, time.time())  # rates leave out the compilation before the first steps
            if step % 50 == 0:
                with open(self.out / "train.jsonl", "a") as f:
                    f.write(json.dumps({"step": step, "wall_s": round(time.time() - self.t0, 1),
                                        "loss": values["train/loss"], "lr": values["lr"]}) + "\n")
            if step % EVERY == 0:
                self.evaluate(step)
                (s0, t0), now = self.mark, time.time()
                self.mark = (step, now)
                if (self.deadline and step < self.cfg.trainer.steps_budget
                        and now + (now - t0) * EVERY / (step - s0) > self.deadline):
                    raise Stop(f"stopped after step {step}: the next {EVERY} steps would end after the deadline")
        elif "test/mean_str_acc" in values:  # the seed's own evaluation after its last step, at every length
            with open(self.out / "final_eval.jsonl", "a") as f:
                f.write(json.dumps({"length": values["test/seq_len"], "str": values["test/mean_str_acc"],
                                    "char": values["test/mean_char_acc"]}) + "\n")


def letters_beyond(char: dict) -> float:
    """The share of letters right over the lengths beyond the training strings, pooled as this repo pools it."""
    beyond = [(int(n), v) for n, v in char.items() if int(n) > TRAIN_MAX]
    return sum(n * v for n, v in beyond) / sum(n for n, _ in beyond)


def compose_config(src: Path, pe: str, seed: int):
    from hydra import compose, initialize_config_dir
    with initialize_config_dir(version_base=None, config_dir=str(src / "configs/copying")):
        return compose(config_name="copying", overrides=[*SWEEP, f"trainer.seed={seed}", *SCHEMES[pe]])


def cmd_run(a) -> None:
    import logging

    import accelerate
    import torch
    from accelerate.logging import get_logger
    from omegaconf import OmegaConf
    src, out = Path(a.src).resolve(), Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    seed_main = import_seed_module(src, "copying", names=("wandb",))  # wandb: no network on the device
    seed_main.log = get_logger(seed_main.__name__)  # main.py defines `log` only when run as a script
    cfg = compose_config(src, a.pe, a.seed)
    # what schedule_copying.py does before submitting: the model's config as a JSON file the loop loads
    (out / "model_config.json").write_text(json.dumps(OmegaConf.to_container(cfg.model, resolve=True), indent=0))
    cfg.trainer.model_name_or_path = str(out / "model_config.json")
    cfg.trainer.output_dir = str(out)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    obs = Observer(out, seed_main, cfg, a.deadline)

    class Watched(accelerate.Accelerator):
        def prepare(self, *args, **kw):
            prepared = super().prepare(*args, **kw)
            for x in prepared if isinstance(prepared, tuple) else (prepared,):
                if isinstance(x, torch.nn.Module):
                    obs.model = x
            return prepared

        def log(self, values, step=None, log_kwargs=None):
            obs.on_log(values, step)
            return super().log(values, step=step, log_kwargs=log_kwargs or {})

    seed_main.Accelerator = Watched
    try:
        seed_main.main(cfg)
    except Stop as e:
        print(f"[observer] {e}", flush=True)


# ----------------------------------------------------------------------------------------------- record, plot
def seed_run(run: Path) -> dict:
    evals = read_jsonl(run / "evals.jsonl")
    final = read_jsonl(run / "final_eval.jsonl")
    return {"train": read_jsonl(run / "train.jsonl"), "evaluations": evals, **({"final": final} if final else {})}


def repo_run(run: dict) -> dict:
    """A run of this repo's copying records (data/tasks: val_acc@L strings right with <eos>; the letters per length
    only at the end), in the seed side's shape."""
    evals = [{"step": e["step"], "str_eos": {str(n): e[f"val_acc@{n}"] for n in LENGTHS},
              "letters_beyond": e.get("val_char_acc_extrap")} for e in run["evaluations"]]
    return {"train": [], "evaluations": evals, "final_char": run.get("curve_char")}


def scheme_of(name: str) -> str | None:
    if "nope" in name:
        return "NoPE"
    if "selective_rope" in name and "bias" not in name and "phase_gate" not in name:
        return "Selective RoPE"
    return None


def seed_of(name: str) -> int:
    return int(name.rsplit("-s", 1)[1].split("-")[0])


def cmd_record(a) -> None:
    rec = {"device": a.device, "date": a.date, "software": a.software, "note": a.note, "seed_code": {}, "repo": {}}
    for r in a.seed_runs:
        rec["seed_code"][Path(r).name] = seed_run(Path(r))
    for path in a.repo_records:
        runs = json.loads(Path(path).read_text())["runs"]
        for name, run in runs.items():
            if scheme_of(name):
                rec["repo"][name] = {**repo_run(run), "record": Path(path).name}
    write_atomic(a.out, json.dumps(rec, indent=1))
    print(f"wrote {a.out}: {len(rec['seed_code'])} runs of the seed's code, {len(rec['repo'])} of this repo")


def beyond(e: dict) -> float | None:
    """Letters right beyond 64 at an evaluation: pooled from per-length shares (the seed's side) or as recorded."""
    return letters_beyond(e["char"]) if "char" in e else e.get("letters_beyond")


def by_step(rec: dict) -> dict:
    """{(side, scheme, step): [(seed, evaluation), ...]} over the runs of the two schemes compared."""
    rows = {}
    for side in ("seed_code", "repo"):
        for name, run in rec[side].items():
            scheme = scheme_of(name)
            for e in run["evaluations"] if scheme else []:
                rows.setdefault((side, scheme, e["step"]), []).append((seed_of(name), e))
    return {k: sorted(v, key=lambda r: r[0]) for k, v in rows.items()}


def table(rec: dict, steps=(1000, 3000, 4500, 5000)) -> str:
    """Markdown, a row per (step, code, scheme): each seed's strings copied whole (letters and '.') at 64 / 96 /
    128, and letters right beyond 64."""
    rows = by_step(rec)
    lines = ["| step | code | scheme | seeds | strings copied at 64 | at 96 | at 128 | letters right beyond 64 |",
             "|---:|---|---|---|---|---|---|---|"]
    for step in steps:
        for side, label in (("seed_code", "seed's code"), ("repo", "this repo")):
            for scheme in ("NoPE", "Selective RoPE"):
                runs = rows.get((side, scheme, step), [])
                if not runs:
                    continue
                cell = lambda n: " / ".join(f"{100 * e['str_eos'][str(n)]:.0f}" for _, e in runs)  # noqa: E731
                lets = " / ".join(f"{100 * beyond(e):.1f}" for _, e in runs)
                lines.append(f"| {step:,} | {label} | {scheme} | {', '.join(str(s) for s, _ in runs)} | {cell(64)}% | "
                             f"{cell(96)}% | {cell(128)}% | {lets}% |")
    return "\n".join(lines)


def rank_sum_p(a: list[float], b: list[float]) -> float:
    """One-sided exact rank-sum (Mann-Whitney) p of `a` lying above `b`: the share of the splits of the pooled values
    into groups of len(a) and len(b) whose first group's rank sum is at least a's (ties: mean ranks)."""
    from itertools import combinations
    pooled = a + b
    order = sorted(pooled)
    rank = {v: np.mean([i + 1 for i, w in enumerate(order) if w == v]) for v in pooled}
    ranks = [rank[v] for v in pooled]
    seen = sum(ranks[:len(a)])
    splits = list(combinations(range(len(pooled)), len(a)))
    return sum(sum(ranks[i] for i in c) >= seen - 1e-9 for c in splits) / len(splits)


def last_values(rec: dict, side: str, scheme: str) -> tuple[list[float], list[float]]:
    """Strings copied at 96 and letters right beyond 64 (%), at each run's last evaluation."""
    last = [r["evaluations"][-1] for n, r in sorted(rec[side].items()) if scheme_of(n) == scheme and r["evaluations"]]
    return [100 * e["str_eos"]["96"] for e in last], [100 * beyond(e) for e in last]


def summary(rec: dict) -> str:
    """Markdown, a row per code and scheme: over each run's last evaluation, the runs that copied any string of 128
    and the range of strings copied at 96 and of letters right beyond 64."""
    lines = ["| code | scheme | runs (seeds) | last evaluation at step | any string of 128 copied | "
             "strings copied at 96 | letters right beyond 64 |", "|---|---|---|---|---|---|---|"]
    for side, label in (("seed_code", "the seed's code"), ("repo", "this repo")):
        for scheme in ("NoPE", "Selective RoPE"):
            last = [(seed_of(n), r["evaluations"][-1]) for n, r in sorted(rec[side].items())
                    if scheme_of(n) == scheme and r["evaluations"]]
            if not last:
                continue
            at96 = [100 * e["str_eos"]["96"] for _, e in last]
            lets = [100 * beyond(e) for _, e in last]
            lines.append(f"| {label} | {scheme} | {len(last)} ({', '.join(str(s) for s, _ in last)}) | "
                         f"{', '.join(format(e['step'], ',') for _, e in last)} | "
                         f"{sum(e['str_eos']['128'] > 0 for _, e in last)} of {len(last)} | "
                         f"{min(at96):.0f}–{max(at96):.0f}% | {min(lets):.1f}–{max(lets):.1f}% |")
    tests = []
    for scheme in ("NoPE", "Selective RoPE"):
        (s96, slet), (r96, rlet) = last_values(rec, "seed_code", scheme), last_values(rec, "repo", scheme)
        if s96 and r96:
            tests.append(f"{scheme}: strings at 96, means {np.mean(r96):.1f}% against {np.mean(s96):.1f}%, "
                         f"p = {rank_sum_p(r96, s96):.3f}; letters beyond 64, means {np.mean(rlet):.1f}% against "
                         f"{np.mean(slet):.1f}%, p = {rank_sum_p(rlet, slet):.3f}")
    if tests:
        lines.append("\nThis repo above the seed's code (one-sided exact rank-sum test at each run's last evaluation): "
                     + "; ".join(tests) + ".")
    return "\n".join(lines)


def cmd_plot(a) -> None:
    """Two panels over training steps (letters right beyond 64; strings copied at 96), one line a run, and two over
    length at each run's last evaluation (strings copied, letters right)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    rec = json.loads(Path(a.record).read_text())
    color = {"seed_code": "tab:red", "repo": "tab:blue"}
    style = {"NoPE": ":", "Selective RoPE": "-"}
    last = sorted({run["evaluations"][-1]["step"] for side in ("seed_code", "repo") for run in rec[side].values()})
    last = " or ".join(f"{s:,}" for s in last)
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    for side in ("seed_code", "repo"):
        for name, run in sorted(rec[side].items()):
            scheme = scheme_of(name)
            if scheme is None:
                continue
            ev = run["evaluations"]
            kw = dict(color=color[side], ls=style[scheme], lw=1, marker="o", markersize=2.5)
            axes[0, 0].plot([e["step"] for e in ev], [100 * beyond(e) for e in ev], **kw)
            axes[0, 1].plot([e["step"] for e in ev], [100 * e["str_eos"]["96"] for e in ev], **kw)
            at = ev[-1]
            axes[1, 0].plot(LENGTHS, [100 * at["str_eos"][str(n)] for n in LENGTHS], **kw)
            char = at.get("char") or run.get("final_char")  # this repo's records keep the letters at the end only
            axes[1, 1].plot(LENGTHS, [100 * char[str(n)] for n in LENGTHS], **kw)
    axes[0, 0].set(title="letters right beyond the training lengths (65-512, pooled)", xlabel="step", ylabel="%")
    axes[0, 1].set(title="strings of 96 letters copied whole (letters and end mark)", xlabel="step", ylabel="%")
    for ax, what in ((axes[1, 0], "strings copied whole"), (axes[1, 1], "letters right")):
        ax.set(title=f"{what}, at each run's last evaluation (step {last})", xlabel="string length", ylabel="%")
    for ax in axes.flat:
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3)
        ax.set_ylim(-2, 102)
    for ax in axes[1]:
        ax.set_xscale("log", base=2)
        ax.axvline(TRAIN_MAX, color="gray", ls="--", lw=1)
    handles = [Line2D([], [], color=color[s], ls=style[p], label=f"{lab}, {p}") for s, lab in
               (("seed_code", "the seed's code"), ("repo", "this repo")) for p in style]
    finish_figure(fig, handles, a.title, a.out)
    print(summary(rec))
    print(table(rec))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="the seed's copying main.py, observed")
    r.add_argument("src")
    r.add_argument("out")
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--pe", choices=sorted(SCHEMES), required=True)
    r.add_argument("--deadline", type=float, help="Unix time: stop after the last evaluation that ends before it")
    c = sub.add_parser("record", help="one JSON record of both sides' runs")
    c.add_argument("--seed-runs", nargs="*", default=[])
    c.add_argument("--repo-records", nargs="*", default=[], help="this repo's copying records (docs/synthetic)")
    c.add_argument("--out", required=True)
    describe_record(c)
    f = sub.add_parser("plot", help="the record as one figure and a markdown table")
    f.add_argument("record")
    f.add_argument("--out", required=True)
    f.add_argument("--title", default="")
    a = p.parse_args(argv)
    {"run": cmd_run, "record": cmd_record, "plot": cmd_plot}[a.cmd](a)


if __name__ == "__main__":
    main()
