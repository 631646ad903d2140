"""Synthetic tasks (data/tasks/): generators checked against independent computations, determinism, no leakage,
the accuracy metric, and training through train.py / eval.py / a sweep as a user runs them."""

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, compose, sweep_job

from duality.data import Tokenizer, tasks
from duality.data.tasks import copying, mqar, state_tracking
from duality.model import ConfigError, build_model

SMALL = {"train_examples": 64, "test_examples": 16}


def build(name, **over):
    cfg = {**compose([f"data={name}"]).data, **SMALL, **over}
    return tasks.build(cfg)


# ------------------------------------------------------------------------------------------------- MQAR
def test_mqar_layout_and_no_leakage():
    V, T, K = 64, 48, 6
    x, y = mqar.generate(np.random.default_rng(0), 200, T, K, V, power_a=0.01, random_non_queries=False)
    assert x.shape == y.shape == (200, T)
    for row_x, row_y in zip(x, y):
        keys, values = row_x[0:2 * K:2], row_x[1:2 * K:2]
        assert len(set(keys)) == K and len(set(values)) == K
        assert ((1 <= keys) & (keys < V // 2)).all() and ((V // 2 <= values) & (values < V)).all()
        scored = np.flatnonzero(row_y >= 0)
        assert len(scored) == K and (scored >= 2 * K).all() and (scored % 2 == 0).all()
        kv = dict(zip(keys, values))
        for t in scored:
            assert row_x[t] in kv and row_y[t] == kv[row_x[t]]  # the query is a key, the answer its value
            # the answer is only in the context, right after its key: nowhere from the query on, nowhere else
            where = np.flatnonzero(row_x == row_y[t])
            assert len(where) == 1 and where[0] < 2 * K and row_x[where[0] - 1] == row_x[t]
        rest = np.setdiff1d(np.arange(2 * K, T), scored)
        assert (row_x[rest] == 0).all()


def test_mqar_power_law_gaps_and_random_fill():
    def mean_gap(a):
        _, y = mqar.generate(np.random.default_rng(1), 400, 256, 4, 1024, power_a=a, random_non_queries=False)
        return np.mean([np.flatnonzero(r >= 0).mean() for r in y])
    assert mean_gap(0.01) < mean_gap(1.0) - 30  # small a puts queries near the pairs; a = 1 is uniform
    x, _ = mqar.generate(np.random.default_rng(2), 50, 64, 4, 256, power_a=0.01, random_non_queries=True)
    assert len(np.unique(x[:, 8:])) > 100


def test_tasks_are_deterministic_by_seed_and_split():
    for name in ("mqar", "copying", "parity", "mad_in_context_recall", "mad_memorization"):
        a, b, c = build(name), build(name), build(name, seed=7)
        (xa, ya), (xb, yb), (xc, _) = (t.train.batch(range(len(t.train))) for t in (a, b, c))
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert not torch.equal(xa, xc), name
        n = min(len(xa), len(a.evals[0].inputs))
        w = min(xa.shape[1], a.evals[0].inputs.shape[1])
        assert not np.array_equal(xa[:n, :w].numpy(), a.evals[0].inputs[:n, :w]), name  # train != test draws


def test_examples_order_is_a_function_of_the_sample_index():
    t = build("parity", train_examples=10)
    first = [t.train.batch([g])[0] for g in range(10)]
    assert sorted(int((t.train.inputs == f.numpy()).all(1).nonzero()[0][0]) for f in first) == list(range(10))
    x1, _ = t.train.batch(range(12, 20))
    x2, _ = build("parity", train_examples=10).train.batch(range(12, 20))
    assert torch.equal(x1, x2)


# ---------------------------------------------------------------------------------------------- copying
def test_copying_targets_are_the_string_then_eos():
    V = 26
    lengths = np.array([2, 5, 17, 40])
    x, y = copying.generate(np.random.default_rng(0), lengths, V, 90)
    bos, cp, eos, pad = V, V + 1, V + 2, V + 3
    for L, row_x, row_y in zip(lengths, x, y):
        s = row_x[1:L + 1]
        assert row_x[0] == bos and row_x[L + 1] == cp and (s < V).all()
        assert list(row_x[L + 2:2 * L + 2]) == list(s) and (row_x[2 * L + 3:] == pad).all()
        scored = np.flatnonzero(row_y >= 0)
        assert list(scored) == list(range(L + 1, 2 * L + 2))
        assert list(row_y[scored]) == list(s) + [eos]
    t = build("copying")
    assert [e.length for e in t.evals] == list(compose(["data=copying"]).data.eval_lengths)
    assert all(e.exact and e.inputs.shape[1] == 2 * e.length + 2 for e in t.evals)
    assert t.train.batch([0])[0].shape == (1, 419) and t.train_len == 64
    assert build("copying", packed=False, seq_len=130).train.inputs.shape[1] == 130
    with pytest.raises(ConfigError, match="seq_len must be >= 2 max_len"):
        build("copying", seq_len=100)


def test_copying_packed_rows_are_whole_examples_back_to_back():
    """The seed's code's training rows: <bos> s <copy> s <eos> repeated until seq_len + 1 tokens are filled, the
    copy and <eos> of every whole example scored, nothing of the one cut off; a fresh row per sample index,
    whatever batch it is drawn in. Checked by parsing each row back into its examples."""
    V, T = 26, 419
    bos, cp, eos = V, V + 1, V + 2
    t = build("copying")
    x, y = t.train.batch(range(300))
    x1, y1 = t.train.batch([7, 250])
    assert torch.equal(x1, x[[7, 250]]) and torch.equal(y1, y[[7, 250]])
    assert len({tuple(r) for r in x.tolist()}) == 300
    lengths, starts = [], []
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        full = row_x + [None]  # the last target is token T, known only through row_y
        full[T] = row_y[T - 1] if row_y[T - 1] >= 0 else None
        expect, p = [-1] * T, 0
        while p < T:
            assert full[p] == bos
            L = full[p + 1:].index(cp) if cp in full[p + 1:] else None
            if L is None or p + 2 * L + 2 > T:  # cut off: nothing scored from here on
                break
            s = full[p + 1:p + 1 + L]
            assert all(0 <= c < V for c in s) and 2 <= L <= 64
            assert full[p + L + 2:p + 2 * L + 2] == s and (p + 2 * L + 2 == T or full[p + 2 * L + 2] == eos)
            expect[p + L + 1:p + 2 * L + 2] = s + [eos]
            lengths.append(L), starts.append(p + L + 1)
            p += 2 * L + 3
        assert row_y == expect
    assert set(lengths) == set(range(2, 65))  # uniform in [2, 64]
    assert max(starts) > 300  # copies start all over the context, not only at position L + 1


# ------------------------------------------------------------------------------------------- state tracking
def _compose(p, q):
    return tuple(p[q[i]] for i in range(len(p)))


@pytest.mark.parametrize("group", state_tracking.GROUPS)
def test_state_tracking_drawn_in_chunks_is_the_one_draw(group):
    """generate draws its rows a chunk at a time (memory): the same sequences as one draw of every row, which is how
    every recorded run's data was made, for a row count that is no multiple of the chunk and an odd length."""
    mul = state_tracking.table(group)
    x = tasks.rng_for(0, "train").integers(0, len(mul), size=(1003, 33))
    s = np.empty_like(x)
    s[:, 0] = x[:, 0]
    for t in range(1, 33):
        s[:, t] = mul[x[:, t], s[:, t - 1]]
    cx, cs = state_tracking.generate(tasks.rng_for(0, "train"), 1003, 33, group, chunk=100)
    assert cx.dtype == cs.dtype == np.int8 and (cx == x).all() and (cs == s).all()


@pytest.mark.parametrize("group,order", [("S2", 2), ("A3", 3), ("S3", 6)])
def test_state_tracking_labels_match_permutation_products(group, order):
    el = state_tracking.elements(group)
    assert len(el) == order and el[0] == tuple(range(len(el[0])))
    mul = state_tracking.table(group)
    for a, b, c in itertools.product(range(order), repeat=3):  # a group: associative, identity first
        assert mul[mul[a, b], c] == mul[a, mul[b, c]]
    assert (mul[0] == np.arange(order)).all()
    x, s = state_tracking.generate(np.random.default_rng(3), 20, 40, group)
    for row_x, row_s in zip(x, s):
        state = el[row_x[0]]
        assert el[row_s[0]] == state
        for t in range(1, 40):  # apply each permutation after the previous ones, on explicit tuples
            state = _compose(el[row_x[t]], state)
            assert el[row_s[t]] == state
    if group == "S2":
        assert (s == np.cumsum(x, 1) % 2).all()  # parity of the number of swaps


def test_parity_data_labels_are_the_running_parity():
    """What train.py reads: <bos> x_1..x_T, targets -1, then (x_1 + .. + x_t) mod 2, for training and test sets."""
    t = build("parity")
    for x, y in ((t.train.inputs, t.train.targets), (t.evals[0].inputs, t.evals[0].targets)):
        bits = x[:, 1:].astype(np.int64)
        assert set(np.unique(bits)) == {0, 1} and (y[:, 0] == -1).all()
        assert (y[:, 1:] == np.cumsum(bits, 1) % 2).all()
    xb, yb = t.train.batch(range(5))  # through the epoch order: rows stay intact
    assert (yb[:, 1:] == torch.cumsum(xb[:, 1:], 1) % 2).all()


def test_state_tracking_configs():
    for name, group in (("parity", "S2"), ("a3", "A3"), ("s3", "S3")):
        t = build(name)  # a <bos> first (the seed's code), not scored
        assert t.train.inputs.shape == (64, 129) and t.evals[0].inputs.shape == (16, 513) and t.seq_len == 129
        assert t.evals[0].per_position and t.evals[0].first == 1 and t.train_len == 128
        assert t.symbols == [*("".join(map(str, p)) for p in state_tracking.elements(group)), "<bos>"]
        for x, y in ((t.train.inputs, t.train.targets), (t.evals[0].inputs, t.evals[0].targets)):
            bos = len(t.symbols) - 1
            assert (x[:, 0] == bos).all() and (y[:, 0] == -1).all() and (x[:, 1:] < bos).all()
        t = build(name, bos=False)
        assert t.train.inputs.shape == (64, 128) and t.evals[0].first == 0
        assert len(t.symbols) == len(state_tracking.elements(group))
    with pytest.raises(ConfigError, match="valid choices"):
        tasks.build({"name": "state_tracking", "group": "S4"})
    with pytest.raises(ConfigError, match="unknown option"):
        tasks.build({"name": "state_tracking", "grup": "S3"})


# ---------------------------------------------------------------------------------------------------- MAD
def test_mad_in_context_and_noisy_recall_score_repeated_keys():
    for name in ("mad_in_context_recall", "mad_noisy_in_context_recall"):
        cfg = compose([f"data={name}"]).data
        t = build(name)
        ns = cfg.vocab_size - cfg.noise_vocab_size
        x, y = t.evals[0].inputs.astype(int), t.evals[0].targets.astype(int)
        tx, ty = t.train.inputs.astype(int), t.train.targets.astype(int)
        assert (ty[:, :-1] == tx[:, 1:]).all()  # training: next-token loss everywhere (MAD)
        for row_x, row_y in zip(x, y):
            seen = {}
            for i in range(0, len(row_x) - 1, 2):  # pairs (k, v) at even positions
                k, v = row_x[i], row_x[i + 1]
                if k >= ns:  # a noise slot: two noise tokens, never scored
                    assert row_x[i + 1] >= ns and row_y[i] == -1
                    continue
                assert k < ns // 2 <= v < ns
                assert row_y[i] == (v if k in seen else -1)  # scored at the key: the value comes next
                assert seen.setdefault(k, v) == v  # a key keeps its value
            assert row_y[-1] == seen[row_x[-1]]  # the final probe asks a key seen before
        assert (y >= 0).sum(1).min() >= 1


def test_mad_fuzzy_recall_probe_is_planted_and_asked():
    t = build("mad_fuzzy_in_context_recall", test_examples=40)
    x, y = t.evals[0].inputs.astype(int), t.evals[0].targets.astype(int)
    k = 3  # test keys are k_motif_size long
    for row_x, row_y in zip(x, y):
        scored = np.flatnonzero(row_y >= 0)
        assert len(scored) >= 1
        tail = scored[scored >= len(row_x) - 3 - 1]
        v_probe = row_y[tail]
        first = tail[0]
        key = row_x[first - k + 1:first + 1]  # the probe key ends where the probe value's first target sits
        seq = list(row_x)
        found = [i for i in range(first - k)
                 if seq[i:i + k] == list(key) and seq[i + k:i + k + len(v_probe)] == list(v_probe)]
        assert found, (row_x, row_y)


def test_mad_selective_copying_compression_memorization():
    t = build("mad_selective_copying")
    V, m = 16, 16
    for row_x, row_y in zip(t.train.inputs.astype(int), t.train.targets.astype(int)):
        copy_at = int(np.flatnonzero(row_x == V - 1)[0])
        tokens = row_x[:copy_at][row_x[:copy_at] != V - 2]
        assert len(tokens) == m and list(row_y[-m:]) == list(tokens) and (row_y[:-m] == -1).all()
    t = build("mad_compression")
    assert t.head == "compress" and (t.train.inputs == t.train.targets).all() and (t.train.inputs[:, -1] == 15).all()
    t = build("mad_memorization")
    x = np.concatenate([t.train.inputs, t.evals[0].inputs]).astype(int)
    y = np.concatenate([t.train.targets, t.evals[0].targets]).astype(int)
    keys, vals = x[:, 0::2].ravel(), y[:, 1::2].ravel()
    assert (x[:, 1::2] == 255).all() and (y[:, 0::2] == -1).all()
    mapping = {}
    for k, v in zip(keys, vals):
        assert mapping.setdefault(k, v) == v  # one fixed map across all examples, train and test
    assert not set(vals) & set(x.ravel())  # values are never shown: they must be memorised
    with pytest.raises(ConfigError, match="valid MAD tasks"):
        tasks.build({"name": "mad", "task": "recall"})


# ------------------------------------------------------------------------------------------------- metric
class Oracle(torch.nn.Module):
    """Logits that put all mass on the target (or on `wrong` where `bad(t, length)` holds)."""

    def __init__(self, lookup, vocab, bad=lambda pos: False):
        super().__init__()
        self.lookup, self.vocab, self.bad = lookup, vocab, bad

    def forward(self, x):
        y = self.lookup[tuple(map(tuple, x.tolist()))]
        pred = y.clamp(min=0).clone()
        pos = torch.arange(x.shape[1]).expand_as(pred)
        pred[self.bad(pos)] = (pred[self.bad(pos)] + 1) % self.vocab
        return torch.nn.functional.one_hot(pred, self.vocab).float() * 10, None


def _oracle(task, bad=lambda pos: torch.zeros_like(pos, dtype=torch.bool)):
    table = {}
    for s in task.evals:
        for b in range(0, len(s.inputs), 8):
            xs = torch.from_numpy(s.inputs[b:b + 8].astype(np.int64))
            table[tuple(map(tuple, xs.tolist()))] = torch.from_numpy(s.targets[b:b + 8].astype(np.int64))
    return Oracle(table, len(task.symbols), bad)


def test_evaluate_curves():
    t = build("parity")  # position 0 is <bos>: position p is the prefix of length p
    m = tasks.evaluate(_oracle(t), t, 8, "cpu")
    assert m["val_acc"] == 1.0 and m["val_acc_extrap"] == 1.0 and sorted(m["curve"]) == list(range(1, 513))
    assert m["val_seq_acc"] == 1.0 and m["val_seq_acc_extrap"] == 1.0 and tasks.headline(m) == 1.0
    m = tasks.evaluate(_oracle(t, bad=lambda pos: pos >= 201), t, 8, "cpu")  # wrong from prefix length 201 on
    assert m["val_acc"] == 1.0 and m["curve"][200] == 1.0 and m["curve"][201] == 0.0
    assert m["val_acc_extrap"] == pytest.approx(72 / 384)
    assert m["curve_seq"][200] == 1.0 and m["curve_seq"][512] == 0.0 and m["val_seq_acc_extrap"] == 0.0
    pts = tasks.log_points(m["curve"], 128)
    assert list(pts) == [f"val_acc@{n}" for n in range(64, 513, 64)] and pts["val_acc@192"] == 1.0
    # one wrong position: per position it is one dip; "every position up to L right" stays wrong after it
    m = tasks.evaluate(_oracle(t, bad=lambda pos: pos == 100), t, 8, "cpu")
    assert m["curve"][100] == 0.0 and m["curve"][101] == 1.0 and m["val_acc"] == pytest.approx(127 / 128)
    assert m["curve_seq"][99] == 1.0 and m["curve_seq"][100] == 0.0 and m["curve_seq"][512] == 0.0
    assert m["val_seq_acc"] == 0.0 and tasks.headline(m) == 0.0
    t = build("parity", bos=False)  # without <bos>: position p is the prefix of length p + 1
    m = tasks.evaluate(_oracle(t, bad=lambda pos: pos == 100), t, 8, "cpu")
    assert m["curve"][101] == 0.0 and m["curve"][100] == 1.0 and sorted(m["curve"]) == list(range(1, 513))
    t = build("copying", eval_lengths=[8, 100])  # exact match: one wrong token fails the whole string
    m = tasks.evaluate(_oracle(t, bad=lambda pos: pos == 150), t, 8, "cpu")
    assert m["curve"] == {8: 1.0, 100: 0.0} and m["val_acc"] == 1.0 and m["val_acc_extrap"] == 0.0
    # the seed's character accuracy: 99 of the 100 letters right; <eos> (the target at 2L + 1) is not a letter
    assert m["curve_char"] == {8: 1.0, 100: 0.99} and m["val_char_acc_extrap"] == 0.99 and m["val_char_acc"] == 1
    m = tasks.evaluate(_oracle(t, bad=lambda pos: pos == 201), t, 8, "cpu")
    assert m["curve"] == {8: 1.0, 100: 0.0} and m["curve_char"] == {8: 1.0, 100: 1.0}
    assert tasks.summary(m, t).endswith("| acc beyond 64 0.0000 | letters 1.0000 | letters beyond 1.0000")


def test_evaluation_batches_by_tokens_without_changing_results(monkeypatch):
    """EVAL_TOKENS caps the rows of one evaluation forward (the logits' memory); a real model's loss, accuracies and
    curves are the same, to rounding, whatever the cap and micro_batch."""
    t = build("mqar", seq_len=64, num_kv_pairs=4, test_examples=40)
    torch.manual_seed(0)
    cfg = compose(["task=mqar", "backbone=gla", "pe=rope", "model.d_model=32", "data.seq_len=64"])
    model = build_model(cfg.backbone, cfg.pe, {**cfg.model, "head": "lm"}, 8192)
    rows = []
    model.register_forward_hook(lambda mod, args, out: rows.append(args[0].shape[0]))
    ref = tasks.evaluate(model, t, 64, "cpu")
    monkeypatch.setattr(tasks, "EVAL_TOKENS", 3 * 64)  # 3 rows a forward
    small = tasks.evaluate(model, t, 64, "cpu")
    assert rows == [40] + [3] * 13 + [1]  # 40 examples: one forward, then 14 of at most 3 rows
    assert small["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-5) and 0 < ref["val_loss"] < 20
    assert small["val_acc"] == ref["val_acc"] and small["curve"] == ref["curve"]


def test_symbols_tokenizer_and_heads():
    tok = Tokenizer("symbols", json.dumps(copying.symbols(26)))
    ids = tok.encode("<bos> h i <copy>")
    assert ids == [26, 7, 8, 27] and tok.decode(ids) == "<bos> h i <copy>"
    assert Tokenizer.from_dict(tok.to_dict()).encode("a") == [0]
    with pytest.raises(ValueError, match="unknown token"):
        tok.encode("<bos> H")
    cfg = compose(["task=mad", "data=mad_compression", "backbone=gla", "pe=nope"])
    model = build_model(cfg.backbone, cfg.pe, {**cfg.model, "head": "compress", "mlp_hidden": 0}, 64)
    x = torch.randint(0, 16, (2, 12))
    logits, loss = model(x, x)
    assert logits.shape == (2, 12, 64) and torch.isfinite(loss)
    x2 = x.clone()
    x2[:, :-1] = torch.randint(0, 16, (2, 11))  # only the last state is decoded, but it depends on everything
    assert not torch.allclose(model(x2)[0], logits)
    assert not any("mlp" in n for n, _ in model.named_parameters())
    with pytest.raises(ValueError, match="does not generate"):
        model.generate(x, 2)


# -------------------------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_config_errors():
    from duality.trainer.config import check_config
    with pytest.raises(ConfigError, match="set model.seq_len=128"):
        check_config(compose(["data=parity", "model.seq_len=64"]))
    with pytest.raises(ConfigError, match="train.epochs counts passes"):
        check_config(compose(["train.epochs=3"]))
    with pytest.raises(ConfigError, match=r"train.steps=300 and train.epochs=100 both set the budget; .* "
                                          r"\(e.g. train.epochs=null train.steps=300\)"):
        check_config(compose(["task=state_tracking", "train.steps=300"]))  # the task sets epochs
    with pytest.raises(ConfigError, match="batch_size=32 is not a multiple"):
        check_config(compose(["task=mqar", "train.batch_size=32", "train.micro_batch=24"]))
    for name in ("mqar", "copying", "state_tracking", "mad"):
        check_config(compose([f"task={name}"]))
    for sweep in sorted(p.stem for p in (ROOT / "conf" / "sweep").glob("*.yaml")):  # each sweep's first job
        check_config(compose(sweep_job([f"sweep={sweep}"])))


@pytest.mark.slow
def test_easy_mqar_is_learned_and_evaluated(tmp_path):
    """A 2-layer attention model learns an easy MQAR (8 pairs of a 64-token vocabulary: chance 1/32) far above
    chance in a short CPU run; the run logs accuracy, writes task_eval.json and the plot, and eval.py re-scores
    the checkpoint at other settings."""
    from duality import eval as eval_lib
    from duality import train as train_lib
    over = ["task=mqar", "backbone=transformer", "pe=rope", f"out_dir={tmp_path}", "data.vocab_size=64",
            "data.seq_len=32", "data.num_kv_pairs=4", "data.train_examples=4000", "data.test_examples=256",
            "model.d_model=64", "train.epochs=null", "train.steps=500", "train.batch_size=64", "train.micro_batch=64",
            "train.eval_interval=500", "train.log_interval=50", "optim.lr=3e-3", "optim.warmup=0.05",
            "logger.mode=disabled", "train.progress=false", "train.device=cpu"]
    result = train_lib.run(compose(over))
    assert result["val_acc"] > 0.4, result["val_acc"]  # chance: 1/32
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["val_acc"] == result["val_acc"] and "val_acc@32" in rows[-1]
    saved = json.loads((tmp_path / "task_eval.json").read_text())
    assert saved["task"] == "mqar" and saved["curve"] == {"32": result["val_acc"]}
    assert (tmp_path / "accuracy_vs_length.png").stat().st_size > 1000
    cfg = compose([f"ckpt={tmp_path}", "mode=task", "+data_overrides.test=[[32,4],[64,4]]",
                   "+data_overrides.test_examples=64", "device=cpu", f"plot={tmp_path}/e.png"], "eval")
    out = eval_lib.run(cfg)
    assert set(out["curve"]) == {"32", "64"} and out["val_acc"] > 0.5 and (tmp_path / "e.png").exists()


@pytest.mark.slow
def test_sweep_then_collect(tmp_path):
    """`python train.py -m sweep=parity` (made tiny) and scripts/collect_sweep.py's table, CSV and figure."""
    tiny = ["train.epochs=null", "train.steps=3", "data.train_examples=64", "data.test_examples=8", "model.d_model=32",
            "train.batch_size=8", "train.micro_batch=8", "logger.mode=disabled", "train.progress=false",
            "train.device=cpu", "data.eval_len=160", "model.n_heads=2", "seed=0"]
    r = subprocess.run([sys.executable, "train.py", "-m", "sweep=parity", "backbone=gla", "pe=nope,selective_rope",
                        "optim.lr=1e-3,3e-3", f"hydra.sweep.dir={tmp_path}/sw", *tiny], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(list((tmp_path / "sw").glob("*/task_eval.json"))) == 4
    r = subprocess.run([sys.executable, "scripts/collect_sweep.py", str(tmp_path / "sw")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    table = (tmp_path / "sw" / "results.md").read_text()
    assert "| gla + nope |" in table and "| gla + selective_rope |" in table and "(lr " in table
    assert (tmp_path / "sw" / "results.png").stat().st_size > 1000
    assert (tmp_path / "sw" / "results_training.png").stat().st_size > 1000
    assert len((tmp_path / "sw" / "results.csv").read_text().splitlines()) == 3


def test_without_bos_one_layer_gla_cannot_tell_11_from_1():
    """Why every S2 run without <bos> scored 0.763 at prefix length 2: a 1-layer GLA whose values depend on the
    current token alone holds only v(1) in its state after "1" and after "1 1", so its per-head-normalised output
    (and so the logits) are the same for both, though their parities differ; the test set's share of (1, 1)
    prefixes is 0.237. A <bos> (whose value is also in the state) or GLA's short convolutions tell them apart."""
    from duality.model import build_model
    x, _ = state_tracking.generate(tasks.rng_for(0, "test"), 2000, 512, "S2")  # the default test set
    assert ((x[:, 0] == 1) & (x[:, 1] == 1)).mean() == pytest.approx(0.237)

    def last_logits(backbone, seq):
        torch.manual_seed(0)
        m = build_model(backbone, {"name": "nope"}, {"n_layer": 1, "d_model": 32, "n_heads": 2, "seq_len": 8}, 3)
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(20)  # outputs far above the norm's eps
            m.blocks[0].mixer.g_up.bias.fill_(30.0)  # forget gate ~ 1: a decay cannot tell the counts apart either
        return m.double()(torch.tensor([seq]))[0][0, -1]

    BOS = 2
    torch.testing.assert_close(last_logits({"name": "gla"}, [1, 1]), last_logits({"name": "gla"}, [1]),
                               rtol=1e-6, atol=1e-6)
    assert not torch.allclose(last_logits({"name": "gla"}, [BOS, 1, 1]), last_logits({"name": "gla"}, [BOS, 1]),
                              rtol=1e-3, atol=1e-3)
    conv = {"name": "gla", "short_conv": True}
    assert not torch.allclose(last_logits(conv, [1, 1]), last_logits(conv, [1]), rtol=1e-3, atol=1e-3)


def _st_run(tmp_path, *extra):
    """A tiny parity run through train.run: 4-token sequences (no <bos>), evaluated at the same length."""
    from duality import train as train_lib
    return train_lib.run(compose([
        "task=state_tracking", "backbone=gla", "pe=nope", f"out_dir={tmp_path}", "data.bos=false", "data.seq_len=4",
        "data.eval_len=4", "data.train_examples=256", "data.test_examples=64", "model.d_model=32", "model.n_heads=2",
        "train.batch_size=16", "train.micro_batch=16", "train.epochs=null", "train.steps=12", "train.eval_interval=4",
        "train.log_interval=2", "train.ckpt_interval=100", "train.progress=false", "logger.mode=disabled",
        "train.device=cpu", *extra]))


def test_stop_acc_stops_checkpoints_and_stays_stopped(tmp_path):
    r = _st_run(tmp_path, "train.stop_acc=1e-9")  # any accuracy above 0 stops at the first evaluation
    ckpt = torch.load(tmp_path / "checkpoints" / "step_0000004.pt", weights_only=False)
    assert ckpt["stopped_at_acc"] == r["val_seq_acc"] == tasks.headline(r) and r["val_seq_acc"] > 0
    assert json.loads((tmp_path / "task_eval.json").read_text())["step"] == 4
    assert not (tmp_path / "checkpoints" / "step_0000012.pt").exists()
    _st_run(tmp_path, "train.stop_acc=1e-9")  # resumed: nothing left to train
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt")) == ["step_0000004.pt"]
    with pytest.raises(ConfigError, match=r"train.stop_acc=1.5: an accuracy in \(0, 1\]"):
        _st_run(tmp_path, "train.stop_acc=1.5")


def test_time_limit_pauses_and_resume_finishes(tmp_path):
    _st_run(tmp_path, "train.time_limit=1e-9")  # out of time at the first log step: checkpoint and pause
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt")) == ["step_0000002.pt"]
    assert not (tmp_path / "task_eval.json").exists()  # a pause writes no final result
    r = _st_run(tmp_path)
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((tmp_path / "task_eval.json").read_text())["step"] == 12 and r["step"] == 12
    assert sorted(set(steps)) == [2, 4, 6, 8, 10, 12]
    with pytest.raises(ConfigError, match="train.time_limit=0: seconds > 0"):
        _st_run(tmp_path, "train.time_limit=0")


def test_the_s2_negeig_sweep_gives_the_delta_rule_paths_beta_range():
    """sweep=s2_negeig: DeltaNet and Gated DeltaNet with beta in (0, 2), PaTH's range, at the S2 grid's protocol, into
    a folder of its own (not the results record's); each job's model is built with beta_max 2."""
    from duality.model import build_model
    for backbone in ("deltanet", "gated_deltanet"):
        cfg = compose(sweep_job(["sweep=s2_negeig", f"backbone={backbone}"]), hydra_config=True)
        grid = compose(sweep_job(["sweep=results_s2", f"backbone={backbone}"]), hydra_config=True)
        assert cfg.backbone.allow_neg_eigval is True and grid.backbone.allow_neg_eigval is False
        assert (cfg.train, cfg.data, cfg.model) == (grid.train, grid.data, grid.model)
        assert cfg.hydra.sweeper.params["optim.lr"] == grid.hydra.sweeper.params["optim.lr"] == "1.7e-4,5e-4,1.5e-3"
        assert cfg.hydra.sweep.dir == "outputs/results/s2_negeig" and cfg.hydra.launcher.record is None
        model = build_model(cfg.backbone, cfg.pe, cfg.model, vocab_size=8)
        assert {m.beta_max for m in model.modules() if hasattr(m, "beta_max")} == {2.0}
    assert compose(["sweep=s2_negeig"], hydra_config=True).hydra.sweeper.params.pe == "nope,rope,selective_rope"
