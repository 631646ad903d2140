"""reproductions/official_ab_copying.py: how the seed's copying runs are scored, observed, recorded and compared with
this repo's (docs/synthetic, "Seed 004's own code beside this repo: copying"). The seed's code is not in CI: the
observer is driven here by a stand-in with its evaluation data's format ($ letters | letters . then * padding)."""

import json
import time
import types

import numpy as np
import pytest
import torch
from official_ab_copying import (LENGTHS, Observer, Stop, by_step, copy_scores, letters_beyond, main, scheme_of,
                                 seed_of, summary, table)

LETTERS, DOLLAR, BAR, DOT, PAD = 26, 26, 27, 28, 29


def row(letters: list[int], width: int) -> list[int]:
    return [DOLLAR, *letters, BAR, *letters, DOT] + [PAD] * (width - 2 * len(letters) - 3)


def test_copy_scores_need_every_letter_and_the_end_mark():
    rng = np.random.default_rng(0)
    s = rng.integers(0, LETTERS, 10).tolist()
    x = torch.tensor([row(s, 30)] * 3)
    pred = torch.roll(x, -1, 1).clone()  # a perfect copier: the guess at t is x[t + 1]
    pred[1, 11 + 3] = (x[1, 11 + 4] + 1) % LETTERS  # row 1: the fourth copied letter wrong
    pred[2, 2 * 10 + 1] = PAD  # row 2: every letter right, the end mark not
    copied, letters = copy_scores(x, pred, [10] * 3)
    assert copied == [True, False, False]
    assert letters == pytest.approx([1.0, 0.9, 1.0])


def test_letters_beyond_pool_by_length():
    char = {"64": 1.0, "96": 0.5, "512": 0.1}  # the training lengths' letters are left out, the rest weighted by length
    assert letters_beyond(char) == pytest.approx((96 * 0.5 + 512 * 0.1) / (96 + 512))


def test_names_select_the_two_schemes_and_their_seeds():
    assert scheme_of("copy-seed-gla-nope-s3") == "NoPE" and seed_of("copy-seed-gla-nope-s3") == 3
    assert scheme_of("copy-gla-selective_rope_copy-s2") == "Selective RoPE"
    assert seed_of("copy-gla-selective_rope_copy-s2") == 2
    assert scheme_of("copy-gla-selective_rope_copy-biastrue-s0") is None  # sweep variants are not compared
    assert scheme_of("copy-gla-selective_rope_copy-phase_gatetrue-biastrue-s0") is None


class StandIn:
    """What the observer calls of the seed's copying main: get_tokenizer, EvalCopyDataset and _score_batch."""

    @staticmethod
    def get_tokenizer(_data):
        return types.SimpleNamespace(), {}, {}

    class EvalCopyDataset:
        def __init__(self, tokenizer, to_token, *, sequence_length, min_length, num_examples, **_):
            self.n, self.width = min_length, max(sequence_length, 2 * min_length + 3)

        def __getitem__(self, i):
            return {"input_ids": torch.tensor(row(np.random.randint(0, LETTERS, self.n).tolist(), self.width))}

    @staticmethod
    def _score_batch(tokenizer, x, pred):
        n = int((x[0] == BAR).nonzero()[0]) - 1
        right = (pred[:, n + 1:2 * n + 1] == x[:, n + 2:2 * n + 2]).float()
        return right.all(1).float().mean().item(), right.mean().item()


class Copier(torch.nn.Module):
    """Copies strings up to `upto` letters long (logits: the next token), guesses 'a' beyond."""

    def __init__(self, upto: int):
        super().__init__()
        self.w, self.upto = torch.nn.Parameter(torch.zeros(1)), upto

    def forward(self, x):
        guess = torch.roll(x, -1, 1)
        n = int((x[0] == BAR).nonzero()[0]) - 1
        if n > self.upto:
            guess = torch.where(torch.arange(x.shape[1]) > n, 0, guess)
        return types.SimpleNamespace(logits=torch.nn.functional.one_hot(guess, 30).float())


def config(steps=5000):
    data = types.SimpleNamespace(vocab_size=26, n_gram=0, length_answer=0, eval_task="copy", sequence_length=420)
    return types.SimpleNamespace(data=data, trainer=types.SimpleNamespace(steps_budget=steps))


def test_observer_evaluates_every_500_steps_and_keeps_the_numpy_state(tmp_path):
    obs = Observer(tmp_path, StandIn, config(), deadline=None)
    obs.model = Copier(upto=96)
    np.random.seed(7)
    before = np.random.get_state()[1].copy()
    for step in range(10, 1010, 10):
        obs.on_log({"train/loss": 1.0 / step, "lr": 1e-3}, step)
    assert (np.random.get_state()[1] == before).all()  # the seed's loop draws its data from numpy too
    evals = [json.loads(x) for x in (tmp_path / "evals.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [500, 1000]
    e = evals[0]
    assert [e["str_eos"][str(n)] for n in LENGTHS] == [1.0] * 5 + [0.0] * 5
    assert e["str"] == e["str_eos"] and e["char"]["96"] == 1.0 and e["char"]["128"] < 0.2
    assert obs.model.training
    train = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in train] == list(range(50, 1001, 50)) and train[0]["loss"] == pytest.approx(1 / 50)
    # the same strings at every evaluation: a model's scores do not move between them
    assert evals[1]["char"] == evals[0]["char"]


def test_observer_stops_after_the_last_evaluation_that_fits(tmp_path):
    obs = Observer(tmp_path, StandIn, config(), deadline=time.time() + 3600)
    obs.model = Copier(upto=8)
    for step in range(10, 510, 10):
        obs.on_log({"train/loss": 1.0, "lr": 1e-3}, step)  # 500 steps in no time: the next 500 fit
    obs.deadline = time.time()
    with pytest.raises(Stop, match="after step 1000"):
        for step in range(510, 1010, 10):
            obs.on_log({"train/loss": 1.0, "lr": 1e-3}, step)
    assert len((tmp_path / "evals.jsonl").read_text().splitlines()) == 2


def test_observer_keeps_the_seeds_own_final_evaluation(tmp_path):
    obs = Observer(tmp_path, StandIn, config(), deadline=None)
    obs.on_log({"test/mean_str_acc": 0.5, "test/mean_char_acc": 0.9, "test/seq_len": 96}, 5097)
    assert json.loads((tmp_path / "final_eval.jsonl").read_text()) == {"length": 96, "str": 0.5, "char": 0.9}


def evaluation(step, at96, letters):
    return {"step": step, "str": {str(n): float(n <= 64) for n in LENGTHS},
            "str_eos": {str(n): float(n <= 64) if n != 96 else at96 for n in LENGTHS},
            "char": {str(n): 1.0 if n <= 64 else letters for n in LENGTHS}}


def test_record_summary_table_and_figure(tmp_path):
    for name, at96, letters in (("copy-seed-gla-nope-s0", 0.25, 0.3), ("copy-seed-gla-selective_rope-s0", 0.0, 0.2),
                                ("copy-seed-gla-selective_rope-s1", 0.5, 0.4)):
        d = tmp_path / name
        d.mkdir()
        (d / "evals.jsonl").write_text("\n".join(json.dumps(evaluation(s, at96, letters)) for s in (500, 1000)))
        (d / "train.jsonl").write_text(json.dumps({"step": 50, "loss": 3.0, "lr": 1e-4}))
    runs = {f"copy-gla-{pe}-s{seed}": {
        "curve_char": {str(n): 1.0 if n <= 64 else 0.25 for n in LENGTHS},
        "evaluations": [{"step": s, "val_char_acc_extrap": 0.25,
                         **{f"val_acc@{n}": float(n <= (128 if pe == "nope" else 96)) for n in LENGTHS}}
                        for s in (500, 1000)]} for pe in ("nope", "selective_rope_copy", "selective_rope_copy-biastrue")
        for seed in (0, 1)}
    (tmp_path / "repo.json").write_text(json.dumps({"runs": runs}))
    out = tmp_path / "ab.json"
    main(["record", "--seed-runs", *[str(p) for p in sorted(tmp_path.glob("copy-seed-*"))],
          "--repo-records", str(tmp_path / "repo.json"), "--out", str(out), "--device", "H200"])
    rec = json.loads(out.read_text())
    assert sorted(rec["repo"]) == ["copy-gla-nope-s0", "copy-gla-nope-s1", "copy-gla-selective_rope_copy-s0",
                                   "copy-gla-selective_rope_copy-s1"]  # the bias variant left out
    rows = by_step(rec)
    assert [s for s, _ in rows[("seed_code", "Selective RoPE", 1000)]] == [0, 1]
    text = summary(rec)
    assert "| the seed's code | Selective RoPE | 2 (0, 1) | 1,000, 1,000 | 0 of 2 | 0–50% | 20.0–40.0% |" in text
    assert "| this repo | NoPE | 2 (0, 1) | 1,000, 1,000 | 2 of 2 | 100–100% | 25.0–25.0% |" in text
    assert "| this repo | Selective RoPE | 2 (0, 1) | 1,000, 1,000 | 0 of 2 | 100–100% | 25.0–25.0% |" in text
    steps = table(rec, steps=(1000,))
    assert "| 1,000 | seed's code | Selective RoPE | 0, 1 | 100 / 100% | 0 / 50% | 0 / 0% | 20.0 / 40.0% |" in steps
    main(["plot", str(out), "--out", str(tmp_path / "ab.png")])
    assert (tmp_path / "ab.png").read_bytes()[:4] == b"\x89PNG"


def test_unknown_scheme_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["run", "src", "out", "--seed", "0", "--pe", "rope"])
    assert "invalid choice: 'rope'" in capsys.readouterr().err


def test_rank_sum_p_is_exact_with_ties():
    from official_ab_copying import rank_sum_p
    assert rank_sum_p([3.0, 4.0], [1.0, 2.0]) == pytest.approx(1 / 6)  # one split of six puts both highest first
    assert rank_sum_p([1.0, 2.0], [3.0, 4.0]) == 1.0
    # rank sum 13; of the 35 splits of ranks 1-7, 5 sum to 12 and half the rest to more: 15 reach 13
    assert rank_sum_p([5.0, 1.0, 7.0], [2.0, 3.0, 4.0, 6.0]) == pytest.approx(15 / 35)
    assert rank_sum_p([1.0], [1.0]) == 1.0
