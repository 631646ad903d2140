"""reproductions/official_ab.py: the seed's S2 data as its generator writes it, and what the observer and the record
read off the seed's runs (docs/synthetic, "Seed 004's own code beside this repo")."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from official_ab import (Observer, first_fit, fisher_greater, fits, fits_table, main, per_length, stand_ins,
                         summarise, table, write_csv)

REPO = Path(__file__).resolve().parents[1]

# S2 as abstract_algebra lists it: element 0 the identity (1 2), element 1 the swap (2 1); a composition table
S2 = [(0, 1), (1, 0)]  # the permutations themselves
INDEX = {p: i for i, p in enumerate(S2)}


def compose(a: int, b: int) -> int:
    pa, pb = S2[a], S2[b]
    return INDEX[tuple(pa[pb[i]] for i in range(2))]


def test_csv_rows_are_distinct_words_and_their_running_products(tmp_path):
    path = tmp_path / "S2=16.csv"
    write_csv(path, 300, 16, seed=3)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [*rows[0]] == ["seed", "input", "target"] and len(rows) == 300
    assert len({r["input"] for r in rows}) == 300  # sampled without repeats, as the generator's set
    for r in rows:
        x = [int(t) for t in r["input"].split(" ")]
        acc, want = 0, []
        for t in x:  # the product of the first t elements, one composition at a time
            acc = compose(acc, t)
            want.append(acc)
        assert r["seed"] == "3" and len(x) == 16 and [int(t) for t in r["target"].split(" ")] == want


def test_csv_is_the_same_for_the_same_seed_and_differs_for_another(tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        write_csv(tmp_path / name, 50, 8, seed)
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes() != (tmp_path / "c").read_bytes()
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary file, renamed


def test_per_length_leaves_out_bos_and_counts_prefixes():
    target = np.array([[7, 1, 0, 1, 1], [7, 0, 0, 1, 0]])
    pred = np.array([[0, 1, 1, 1, 1], [7, 0, 0, 0, 0]])  # row 0 wrong at length 2; row 1 at length 3
    right, prefix, count = per_length(pred, target)
    assert right == [2, 1, 1, 2] and prefix == [2, 1, 0, 0] and count == [2, 2, 2, 2]


def test_summarise_gives_this_repos_numbers():
    curve = [1.0] * 128 + [0.5] * 384
    seq = [1.0] * 100 + [0.25] * 412
    s = summarise(curve, seq)
    assert s["val_acc"] == 1.0 and s["val_acc_extrap"] == 0.5
    assert s["val_seq_acc"] == 0.25 and s["val_seq_acc_extrap"] == 0.25  # all right to 128: 0.25 from 101 on
    assert s["val_acc@64"] == 1.0 and s["val_acc@192"] == 0.5 and "val_acc@576" not in s


def test_observer_counts_steps_scores_evaluations_and_passes_results_through(tmp_path):
    obs = Observer(tmp_path)
    calls = []
    compute = obs.wrap_compute(lambda data, tokenizer=None, metric_fns=None, prefix=None: calls.append(prefix) or 1)
    reduce = obs.wrap_reduce(lambda values: {"val/loss": 0.25} if values == "val" else {"train/loss": 1.0})
    logits = torch.zeros(3, 513, 9)
    target = torch.zeros(3, 513, dtype=torch.long)
    target[0, 200] = 1  # row 0 wrong at length 200 (argmax of zeros is token 0)
    logits[1, 1:, 0] = -1  # row 1 answers token 1 at every position
    for _ in range(100):
        assert compute((logits[:, :129], target[:, :129]), tokenizer=None, metric_fns={}, prefix="train") == 1
    assert reduce("train") == {"train/loss": 1.0}
    compute([(logits[:2], target[:2])], prefix="val", tokenizer=None, metric_fns={})
    compute([(logits[2:], target[2:])], prefix="val", tokenizer=None, metric_fns={})
    assert reduce("val") == {"val/loss": 0.25}
    row = json.loads((tmp_path / "evals.jsonl").read_text())
    assert row["step"] == 100 and row["val_loss"] == 0.25 and len(row["curve"]) == 512
    assert row["curve"][0] == pytest.approx(2 / 3) and row["curve"][199] == pytest.approx(1 / 3)
    assert row["curve_seq"][198] == pytest.approx(2 / 3) and row["curve_seq"][199] == pytest.approx(1 / 3)
    train = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in train] == [50, 100]
    assert train[0]["acc"] == pytest.approx(2 / 3) and train[0]["loss"] == pytest.approx(np.log(9), rel=0.2)
    assert calls.count("train") == 100 and calls.count("val") == 2


def test_stand_ins_answer_main_pys_calls(tmp_path):
    write_csv(tmp_path / "S2=8.csv", 20, 8, 0)
    mods = stand_ins()
    pl = mods["polars"]
    tokens = (pl.read_csv(tmp_path / "S2=8.csv").select(pl.col("input").map_batches(lambda x: x.str.split(" ")))
              .explode("input").unique()["input"].to_list())
    assert tokens == ["0", "1"]
    wandb = mods["wandb"]
    assert wandb.Table(data=[[0, 1]], columns=["a", "b"]) is None and wandb.plot.line(None, "a", "b") is None
    assert wandb.finish() is None and wandb.__spec__.name == "wandb"


def fake_runs(tmp_path):
    seed_run = tmp_path / "seed-gla-selective_rope-s0"
    seed_run.mkdir()
    rows = [{"step": s, "wall_s": s / 10, "loss": 0.7 - s / 1000, "acc": min(1.0, 0.5 + s / 800)} for s in
            range(50, 450, 50)]
    (seed_run / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ev = {"step": 400, "val_loss": 0.1, "curve": [1.0] * 128 + [0.5] * 384, "curve_seq": [1.0] * 512}
    ev.update(summarise(ev["curve"], ev["curve_seq"]))
    (seed_run / "evals.jsonl").write_text(json.dumps(ev) + "\n")
    repo_run = tmp_path / "s2-gla_st-selective_rope_st-s0"
    repo_run.mkdir()
    (repo_run / "metrics.jsonl").write_text(
        json.dumps({"step": 100, "loss": 0.66, "lr": 5e-4}) + "\n"
        + json.dumps({"step": 100, "val_loss": 0.68, "val_acc": 0.52, "val_acc_extrap": 0.5}) + "\n")
    return seed_run, repo_run


def test_record_table_and_figure(tmp_path):
    seed_run, repo_run = fake_runs(tmp_path)
    rec_path, png = tmp_path / "rec.json", tmp_path / "ab.png"
    main(["record", "--seed-runs", str(seed_run), "--repo-runs", str(repo_run), "--out", str(rec_path),
          "--device", "cpu", "--note", "test"])
    rec = json.loads(rec_path.read_text())
    s, r = rec["seed_code"][seed_run.name], rec["repo"][repo_run.name]
    assert len(s["train"]) == 8 and s["final"]["step"] == 400 and "curve" not in s["evaluations"][0]
    assert r["train"] == [{"step": 100, "loss": 0.66}] and r["evaluations"][0]["val_acc"] == 0.52
    assert first_fit(s["train"]) == 400 and first_fit(r["evaluations"], "val_acc") is None  # 0.5 + 400/800 = 1
    lines = table(rec).splitlines()
    assert lines[2].startswith("| seed's code | seed-gla-selective_rope-s0 | 400 | 0.3000 |") and "| 400 |" in lines[2]
    assert "52.0% / 50.0% (step 100)" in lines[3] and "not reached" in lines[3]
    main(["plot", str(rec_path), "--out", str(png)])
    assert png.stat().st_size > 10_000


def test_records_grow_by_call_and_name_clashes_are_refused(tmp_path):
    seed_run, repo_run = fake_runs(tmp_path)
    rec_path = tmp_path / "rec.json"
    main(["record", "--seed-runs", str(seed_run), "--repo-runs", str(repo_run), "--out", str(rec_path)])
    main(["record", "--into", str(rec_path), "--call", "9", "--device", "gpu", "--suffix=-call9",
          "--seed-runs", str(seed_run)])
    other = tmp_path / "spread.json"  # a seed_spread record: runs with evaluations only
    other.write_text(json.dumps({"runs": {"s2-x-s3": {"evaluations": [{"step": 500, "val_acc": 1.0}]}}}))
    main(["record", "--into", str(rec_path), "--suffix=-bf16w", "--from-record", str(other)])
    rec = json.loads(rec_path.read_text())
    assert sorted(rec["seed_code"]) == [seed_run.name, seed_run.name + "-call9"]
    assert rec["seed_code"][seed_run.name + "-call9"]["call"] == "9" and "call" not in rec["seed_code"][seed_run.name]
    assert rec["repo"]["s2-x-s3-bf16w"] == {"train": [], "evaluations": [{"step": 500, "val_acc": 1.0}]}
    with pytest.raises(SystemExit, match="already in the record"):
        main(["record", "--into", str(rec_path), "--seed-runs", str(seed_run)])


def test_fits_count_only_runs_that_ran_that_far_and_fisher_is_exact():
    def seed(fit, last):  # training batches every 50 steps; accuracy 1 from `fit` on
        return {"train": [{"step": s, "loss": 0.1, "acc": float(fit is not None and s >= fit)}
                          for s in range(50, last + 1, 50)], "evaluations": []}

    def repo(fit, last):  # evaluations every 500 steps
        return {"train": [], "evaluations": [{"step": s, "val_acc": float(fit is not None and s >= fit),
                                              "val_acc_extrap": 0.6} for s in range(500, last + 1, 500)]}
    rec = {"seed_code": {"seed-gla-selective_rope-s0": seed(350, 1950), "seed-gla-selective_rope-s1": seed(None, 1950),
                         "seed-gla-selective_rope-s2": seed(3200, 3350), "seed-gla-selective_rope-s3": seed(None, 600),
                         "seed-gla-nope-s0": seed(None, 1950)},
           "repo": {"s2-a-s0": repo(None, 4000), "s2-a-s1": repo(3500, 4000), "s2-a-s2-bf16w": repo(1000, 9000)}}
    f = fits(rec)
    seed_fits = f["the seed's code (bf16 weights, its init)"]
    # the run stopped at 600 counts at neither budget; the one at 3,350 counts at 3,500 (150 short), NoPE nowhere
    assert seed_fits[2000] == [1, 3] and seed_fits[3500] == [1, 1]
    assert f["this repo, default (fp32 weights)"][3500] == [1, 2]
    assert f["this repo, the seed's precision and init"][2000] == [1, 1]
    assert [name for name, _ in f["this repo, default (fp32 weights)"]["after_fit"]] == ["s2-a-s1"]
    assert fisher_greater(1, 1, 0, 3) == pytest.approx(1 / 4)  # one fit among 4 runs lands in the first
    # (C(4,2) C(16,1) + C(4,3) C(16,0)) / C(20,3)
    assert fisher_greater(2, 4, 1, 16) == pytest.approx((6 * 16 + 4 * 1) / 1140)
    assert "3,500: 100.0 / 60.0 / 0%" in fits_table(rec)


def test_driver_refuses_an_unknown_side(tmp_path):
    p = subprocess.run(["bash", str(REPO / "reproductions/official_ab.sh"), str(tmp_path), "both"], cwd=REPO,
                       capture_output=True, text=True)
    assert p.returncode == 2 and "unknown: both" in p.stdout


def test_unknown_arguments_are_refused():
    p = subprocess.run([sys.executable, str(REPO / "reproductions/official_ab.py"), "data", "/tmp/x", "--bogus"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--bogus" in p.stderr
