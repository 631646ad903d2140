"""Does float8 training (train.float8) follow bf16's loss? Two seeds of each (or more: float8_parity.sh's SEEDS), the
same data, steps and learning rate; float8 passes where its validation losses stay within the spread that bf16 shows
between its own seeds. Any other setting is compared the same way against the default runs (float8_parity.sh: NAME,
VARIANT, MODEL; e.g. quack's SwiGLU at 370m: NAME=quack VARIANT=model.mlp_impl=quack MODEL=370m); its runs are
`<NAME>-s<seed>`, the default's `bf16-s<seed>`.

    python scripts/float8_parity.py corpus /tmp/f8/corpus.jsonl --mb 70     # this machine's Python sources as text
    python data/prepare.py data=text data.files=/tmp/f8/corpus.jsonl data.cache_dir=/tmp/f8/cache +data.bpe_docs=4000
    python scripts/float8_parity.py pack /tmp/f8/cache/text-* f8data         # as LongCrawl64's flat arrays
    bash scripts/float8_parity.sh OUT f8data                                 # 4 runs on 4 GPUs (or in turn)
    python scripts/float8_parity.py report /tmp/f8/runs --record docs/throughput/NEW.json --plot NEW.png

`corpus` writes one JSON line per .py file of the running interpreter's standard library and site-packages (sorted,
up to --mb megabytes; 70 MB gave ~19M tokens): text every machine has, enough that a run of 2,000 steps of 8,192
tokens sees no window twice (the embedded prose corpus holds ~0.5M tokens). `pack` turns prepared shards into
data=longcrawl64's layout (train.bin / heldout.bin of 4,096-token documents, tokenizer.json, bos.txt), which needs
neither `datasets` nor the hub: the GPU machines have neither. `report` reads run folders named `<recipe>-s<seed>`
(each with train.py's metrics.jsonl) and compares, at every evaluation, each float8 run with the bf16 run of its seed
(same initial weights, same batches) against the gap between the bf16 seeds (the largest less the smallest).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import sysconfig
from pathlib import Path

import numpy as np


def corpus(out: str, mb: float) -> None:
    roots = sorted({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})
    files = sorted(str(Path(d) / f) for r in roots for d, _, fs in os.walk(r) for f in fs if f.endswith(".py"))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    size = n = 0
    with open(out, "w") as f:
        for path in files:
            try:
                text = Path(path).read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if len(text) < 200:  # __init__ stubs
                continue
            f.write(json.dumps({"text": text}) + "\n")
            size, n = size + len(text), n + 1
            if size >= mb * 1e6:
                break
    print(f"{out}: {n:,} files, {size / 1e6:.1f} MB of {len(files):,} .py files under {', '.join(roots)}")


def pack(prepared: str, out: str, doc_len: int = 4096) -> None:
    from duality.common.io import atomic_open
    from duality.data import open_prepared
    from duality.data.shards import read_shard
    info = open_prepared(Path(prepared))
    tok = info.tokenizer
    if tok.kind not in ("bpe", "hf") or tok.vocab_size > 2 ** 16:
        raise SystemExit(f"{prepared}: a BPE (trained or pretrained) of at most 65,536 tokens packs as uint16; this "
                         f"one is {tok.kind} with {tok.vocab_size}")
    Path(out).mkdir(parents=True, exist_ok=True)
    for shards, name in ((info.train_shards, "train"), (info.val_shards, "heldout")):
        tokens = np.concatenate([read_shard(s) for s in shards])
        docs = tokens[:len(tokens) // doc_len * doc_len].astype("<u2")
        with atomic_open(Path(out) / f"{name}.bin", "wb") as f:
            f.write(docs.tobytes())
        print(f"{out}/{name}.bin: {len(docs) // doc_len:,} documents of {doc_len} tokens")
    (Path(out) / "tokenizer.json").write_text(tok.spec)
    (Path(out) / "bos.txt").write_text(f"{tok.eot_id}\n")  # data.bos_id: the end-of-text token


def curves(runs: Path) -> dict[str, dict[int, float]]:
    """{run name: {step: val_loss}} from each run folder's metrics.jsonl."""
    out = {}
    for m in sorted(runs.glob("*/metrics.jsonl")):
        rows = [json.loads(line) for line in m.read_text().splitlines() if line.strip()]
        out[m.parent.name] = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
    return out


def compare(val: dict[str, dict[int, float]], base: str = "bf16") -> dict:
    """Per evaluation step: the bf16 seeds' gap, and each other recipe's paired difference from bf16 of its seed."""
    seeds = sorted({n.rsplit("-s", 1)[1] for n in val})
    recipes = sorted({n.rsplit("-s", 1)[0] for n in val} - {base})
    if len(seeds) < 2 or any(f"{base}-s{s}" not in val for s in seeds):
        raise SystemExit(f"need {base}-s<seed> for at least two seeds beside the other recipes; found {sorted(val)}")
    steps = sorted(set.intersection(*(set(v) for v in val.values())))
    rows = []
    for t in steps:
        b = [val[f"{base}-s{s}"][t] for s in seeds]
        row = {"step": t, "bf16_spread": max(b) - min(b), "bf16": b}
        for r in recipes:
            d = [val[f"{r}-s{s}"][t] - val[f"{base}-s{s}"][t] for s in seeds if f"{r}-s{s}" in val]
            row[r] = {"loss": [val[f"{r}-s{s}"][t] for s in seeds if f"{r}-s{s}" in val], "paired_diff": d}
        rows.append(row)
    late = rows[len(rows) // 2:]  # after the first half: the early steps' fast fall makes every gap large
    verdict = {}
    for r in recipes:
        diffs = [statistics.mean(row[r]["paired_diff"]) for row in late]
        spread = statistics.mean(row["bf16_spread"] for row in late)
        final = rows[-1]
        every = [d for row in late for d in row[r]["paired_diff"]]
        # a seed's second half averaged: with more than two seeds, whether the sign holds seed after seed
        per_seed = [statistics.mean(row[r]["paired_diff"][i] for row in late)
                    for i in range(len(final[r]["paired_diff"]))]
        verdict[r] = {"mean_paired_diff_late": statistics.mean(diffs), "mean_bf16_spread_late": spread,
                      "positive_late": f"{sum(d > 0 for d in every)} of {len(every)}",
                      "per_seed_late": per_seed,
                      "se_late": statistics.stdev(per_seed) / len(per_seed) ** 0.5 if len(per_seed) > 1 else None,
                      "worse_final": f"{sum(d > 0 for d in final[r]['paired_diff'])} of {len(final[r]['paired_diff'])}",
                      "final_paired_diff": statistics.mean(final[r]["paired_diff"]),
                      "final_bf16_spread": final["bf16_spread"],
                      "within_spread": abs(statistics.mean(diffs)) <= spread
                      and abs(statistics.mean(final[r]["paired_diff"])) <= max(final["bf16_spread"], spread)}
    return {"seeds": seeds, "steps": steps, "rows": rows, "verdict": verdict}


def plot(val: dict[str, dict[int, float]], result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    # a colour a recipe (bf16 first), a line style a seed
    recipes = ["bf16", *result["verdict"]]
    colours = dict(zip(recipes, ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]))
    styles = dict(zip(result["seeds"], ["-", "--", ":", "-."] * 4))
    for name, c in sorted(val.items()):
        recipe, seed = name.rsplit("-s", 1)
        a.plot(sorted(c), [c[t] for t in sorted(c)], color=colours.get(recipe), label=name, ls=styles[seed])
    a.set(xlabel="step", ylabel="validation loss", title="validation loss", ylim=(None, min(
        max(v.values()) for v in val.values())))
    a.legend()
    steps = [r["step"] for r in result["rows"]]
    spread = [r["bf16_spread"] for r in result["rows"]]
    b.fill_between(steps, [-x for x in spread], spread, color="tab:blue", alpha=0.2, label="± bf16's gap between seeds")
    for r in result["verdict"]:
        for i, seed in enumerate(result["seeds"]):
            b.plot(steps, [row[r]["paired_diff"][i] for row in result["rows"]], color=colours.get(r), marker=".",
                   ls=styles[seed], label=f"{r} - bf16, seed {seed}")
    b.axhline(0, color="grey", lw=0.5)
    b.set(xlabel="step", ylabel="difference of validation loss", ylim=(-0.08, 0.08),
          title=f"{' and '.join(result['verdict'])} against bf16 of the same seed")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("out")
    c.add_argument("--mb", type=float, default=150.0)
    k = sub.add_parser("pack")
    k.add_argument("prepared")
    k.add_argument("out")
    k.add_argument("--doc-len", type=int, default=4096)
    r = sub.add_parser("report")
    r.add_argument("runs", type=Path)
    r.add_argument("--record", help="write the curves and the comparison here (JSON)")
    r.add_argument("--plot", help="draw the curves and the gaps here (PNG)")
    r.add_argument("--note", default="")
    a = p.parse_args(argv)
    if a.cmd == "corpus":
        return corpus(a.out, a.mb)
    if a.cmd == "pack":
        return pack(a.prepared, a.out, a.doc_len)
    val = curves(a.runs)
    result = compare(val)
    for name, v in result["verdict"].items():
        print(f"{name}: paired difference from bf16 {v['mean_paired_diff_late']:+.4f} (second half, mean), "
              f"{v['final_paired_diff']:+.4f} (final); bf16 seeds' gap {v['mean_bf16_spread_late']:.4f} / "
              f"{v['final_bf16_spread']:.4f}: {'within' if v['within_spread'] else 'OUTSIDE'} bf16's spread; "
              f"{v['positive_late']} paired differences of the second half > 0; {v['worse_final']} seeds above bf16 "
              f"at the end")
    if a.record:
        Path(a.record).write_text(json.dumps({"note": a.note, "curves": val, **result}, indent=1) + "\n")
    if a.plot:
        plot(val, result, a.plot)


if __name__ == "__main__":
    sys.exit(main())
