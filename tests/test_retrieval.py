"""Retrieval evaluation (data/tasks/retrieval.py, evals/retrieval.py, eval.py mode=retrieval): the generator is
deterministic and puts the needle where and the prompt as long as asked, scoring matches hand-computed cases, the
lm-eval route (the console script on an export, and eval.py mode=lm_eval) gives mode=retrieval's scores and
predictions, data=retrieval trains, and bad requests are refused in one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from duality import eval as eval_lib
from duality import train as train_lib
from duality.common.errors import ConfigError
from duality.data.tasks import retrieval as R
from duality.data.tokenizer import Tokenizer
from duality.evals import retrieval as RV
from conftest import compose, tiny_overrides

PNG = b"\x89PNG\r\n\x1a\n"
SYMBOLS = Tokenizer("symbols", json.dumps(R.vocabulary()))


@pytest.fixture(scope="module")
def bpe(data_cache, tmp_path_factory):
    """A tiny run on the embedded corpus: its byte-level BPE tokenizer and checkpoint."""
    out = tmp_path_factory.mktemp("bpe_run")
    train_lib.run(compose(tiny_overrides(out, data_cache, "train.steps=2", "model.seq_len=64")))
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny GLA trained for a few steps on data=retrieval (word-level vocabulary, noise haystack)."""
    out = tmp_path_factory.mktemp("retrieval_run")
    train_lib.run(compose([
        f"out_dir={out}", "task=retrieval", "backbone=gla", "pe=nope", "model.n_layer=2", "model.d_model=32",
        "model.n_heads=2", "train.epochs=null", "train.steps=4", "train.batch_size=8", "train.micro_batch=8",
        "data.train_examples=64", "data.test_examples=8", "data.seq_len=192", "data.eval_lengths=[192]",
        "train.eval_interval=4", "train.ckpt_interval=4", "train.progress=false", "logger.mode=disabled",
        "train.device=cpu"]))
    return out


@pytest.mark.parametrize("word_level", [True, False])
@pytest.mark.parametrize("family", R.FAMILIES)
def test_the_generator_is_deterministic_and_puts_the_needle_where_asked(family, word_level, bpe):
    """The same seed gives the same example; the prompt has the asked length in the tokenizer's own tokens (exactly
    for one-word units, else within a sentence) and encodes to the example's tokens; needle 0 starts at the asked
    depth of the haystack's tokens, to within one unit (a word, a filler sentence)."""
    tok = SYMBOLS if word_level else eval_lib.load_model(str(bpe))[1]
    enc = RV.encoder(tok)
    for L, depth, hay in ((300, 0.0, "noise"), (300, 1.0, "repeat"), (700, 0.35, "noise"), (1000, 0.6, "repeat")):
        a = R.make_example(family, L, depth, np.random.default_rng([7, L]), enc, hay, digits=5)
        b = R.make_example(family, L, depth, np.random.default_rng([7, L]), enc, hay, digits=5)
        c = R.make_example(family, L, depth, np.random.default_rng([8, L]), enc, hay, digits=5)
        assert a.prompt == b.prompt and a.answer == b.answer and np.array_equal(a.ids, b.ids)
        assert a.prompt != c.prompt
        assert tok.encode(a.prompt) == a.ids.tolist() and len(a.ids) <= L
        assert len(a.ids) == L if (word_level and hay == "noise") else len(a.ids) > L - 12
        assert tok.encode(a.prompt + a.answer)[len(a.ids):] == a.answer_ids.tolist()
        assert all(v in a.prompt for v in a.values)
        needles = _needles_of(a, family, word_level)
        intro = enc.piece(R.PASSKEY_INTRO if family == "passkey" else R.NIAH_INTRO.format(what="numbers"), "")
        question = a.prompt.split("\n")[-1] if not word_level else a.prompt[a.prompt.rindex(" What "):]
        hay_tokens = len(a.ids) - len(intro) - len(enc.piece(question.strip(), "\n")) - sum(
            len(enc.piece(n)) for n in needles)
        unit = max(len(enc.piece(u)) for u in (R.NOISE if hay == "noise" else R.REPEAT))
        assert abs(a.depth - depth) * hay_tokens <= unit, (a.depth, depth)
        if len(needles) == 1:  # where its tokens are: the intro, then depth x the haystack's tokens
            ids, nd = a.ids.tolist(), enc.piece(needles[0]).tolist()
            at = [i for i in range(len(ids)) if ids[i:i + len(nd)] == nd]
            assert at == [len(intro) + round(a.depth * hay_tokens)], (at, len(intro), a.depth * hay_tokens)


def _needles_of(ex: R.Example, family: str, word_level: bool) -> list[str]:
    """The needle sentences in an example's prompt, read back from its text (as the generator writes them)."""
    import re
    text = ex.prompt.replace(" ", "") if word_level else ex.prompt
    if family == "passkey":
        return [R.PASSKEY_NEEDLE.format(value=ex.values[0].replace(" ", ""))]
    sp = "" if word_level else " "
    found = re.findall(sp.join(["One", "of", "the", "special", "magic", "numbers", "for", r"([a-z]+)", "is:",
                                r"(\d+)\."]), text)
    return [R.NIAH_NEEDLE.format(what="numbers", key=k, value=v) for k, v in found]


def test_the_needles_of_each_family():
    """What each family hides and asks for: distractors share the key's form, values come in the text's order,
    the multi-query question names every key."""
    enc = RV.encoder(SYMBOLS)
    ex = {f: R.make_example(f, 400, 0.5, np.random.default_rng(3), enc, "noise", digits=4) for f in R.FAMILIES}
    for f, e in ex.items():
        n = len(_needles_of(e, f, True))
        assert n == {"passkey": 1, "niah_single": 1, "niah_multikey": 4, "niah_multivalue": 4,
                     "niah_multiquery": 4}[f], f
        assert len(e.values) == (4 if f in ("niah_multivalue", "niah_multiquery") else 1)
        assert e.answer == " " + " , ".join(e.values)
    mv = ex["niah_multivalue"]
    order = [mv.prompt.index(v + " .") for v in mv.values]
    assert order == sorted(order)  # the answer lists the values as the text gives them
    keys = {k for k, _ in [(n.split(" for ")[1].split(" is")[0], 0) for n in _needles_of(mv, "niah_multivalue", True)]}
    assert len(keys) == 1
    mq = ex["niah_multiquery"]
    question = mq.prompt.split("What are all")[1]
    assert sum(k in question.split() for k in R.KEYS) == 4


def test_string_match_and_scores_match_hand_computed_cases():
    """RULER's string match; a model with zero logits: logprob = -A log V, greedy only for an answer of id 0, and
    the generated <pad> tokens (end of text) make an empty prediction."""
    assert RV.string_match("The numbers are 12 and 34.", ["12", "34", "56"]) == pytest.approx(2 / 3)
    assert RV.string_match("ANSWER: Apple-Pie", ["apple-pie"]) == 1.0
    assert RV.continuation(SYMBOLS, [SYMBOLS.encode("1 2")[0], 5, 0, 7]) == "1 " + SYMBOLS.names[5]
    from duality.model import build_model
    torch.manual_seed(0)
    model = build_model({"name": "transformer"}, {"name": "rope"}, {"n_layer": 1, "d_model": 16, "n_heads": 2,
                                                                    "seq_len": 256}, SYMBOLS.vocab_size).eval()
    with torch.no_grad():
        model.lm_head.weight.zero_()
    exs = RV.examples(RV.encoder(SYMBOLS), ["passkey", "niah_multivalue"], [200], 2, 1, "noise", digits=3)
    rows = RV.score(model, SYMBOLS, exs, 4, "cpu", progress=False)
    V = model.lm_head.weight.shape[0]
    for e, r in zip(exs, rows):
        assert r["logprob"] == pytest.approx(-len(e.answer_ids) * np.log(V), rel=1e-5)
        assert r["greedy"] == 0.0 and r["prediction"] == "" and r["string_match"] == 0.0
    s = RV.summarize(rows, 2)
    assert s["by_length"]["200"]["logprob"] == pytest.approx(np.mean([r["logprob"] for r in rows]))


def test_teacher_forced_scores_equal_one_full_forward(run):
    """score()'s chunked prefill + answer chunk gives the log-probabilities of one forward over prompt + answer."""
    model, tok, _ = eval_lib.load_model(str(run))
    exs = RV.examples(RV.encoder(tok), ["niah_multiquery", "passkey"], [200], 2, 1, "noise", digits=4)
    rows = RV.score(model, tok, exs, 8, "cpu", generate=False, progress=False)
    for e, r in zip(exs, rows):
        seq = torch.tensor(np.concatenate([e.ids, e.answer_ids]))[None]
        with torch.no_grad():
            logits = model(seq[:, :-1])[0][0, len(e.ids) - 1:].float()
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(e.answer_ids)[:, None]).sum()
        assert r["logprob"] == pytest.approx(float(lp), rel=1e-4, abs=1e-4)
        assert r["greedy"] == float((logits.argmax(-1) == torch.tensor(e.answer_ids)).all())


def test_data_retrieval_scores_the_answer_only(run):
    """data=retrieval: inputs of seq_len tokens, targets only at the answer's tokens, which follow the question."""
    task = R.build({"name": "retrieval", "train_examples": 16, "test_examples": 4, "eval_lengths": [256]})
    x, y = task.train.batch(range(16))
    assert x.shape == (16, 512)
    for row_x, row_y in zip(x, y):
        scored = (row_y >= 0).nonzero()[:, 0]
        assert 4 <= len(scored) <= 4 * 5 - 1 and (scored[1:] - scored[:-1] == 1).all()
        before = SYMBOLS.decode(row_x[:scored[0] + 1].tolist())
        assert before.endswith(("is", "are")) and "magic" in before or "pass key" in before
        assert torch.equal(row_x[scored[1:]], row_y[scored[:-1]])  # teacher forcing: the answer is the next input
    assert task.evals[0].inputs.shape == (4, 256) and task.evals[0].exact
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("val_acc" in m for m in metrics)
    result = json.loads((run / "task_eval.json").read_text())  # each family's share right, beside the whole curve
    assert list(result["curve_family"]) == list(R.FAMILIES) and set(result["curve_family"]["passkey"]) == {"192"}


def test_data_retrieval_scores_each_family_apart():
    """Each evaluation example knows its family (its prompt says which), and the task evaluation scores the families
    apart: a model right on exactly the passkey examples scores 1 on passkey, 0 on the others, and overall the
    passkey examples' share (the numbers a results cell's 2/3 is made of)."""
    from duality.data import tasks
    task = R.build({"name": "retrieval", "train_examples": 4, "test_examples": 40, "eval_lengths": [256, 384]})
    for s in task.evals:
        assert s.families == R.FAMILIES and len(s.family) == 40
        for row, f in zip(s.inputs, s.family):
            text = SYMBOLS.decode(row.tolist())
            assert ("pass key" in text) == (R.FAMILIES[f] == "passkey")
            assert ("are all" in text) == (R.FAMILIES[f] in ("niah_multivalue", "niah_multiquery"))
    vocab = len(task.symbols)

    class PasskeyOracle(torch.nn.Module):  # the targets of a passkey row, token 0 everywhere else
        def forward(self, x):
            s = next(s for s in task.evals if s.inputs.shape[1] == x.shape[1])
            rows = [next(i for i, r in enumerate(s.inputs) if np.array_equal(r, xr)) for xr in x.numpy()]
            y = torch.from_numpy(s.targets[rows].astype(np.int64)).clamp(min=0)
            y[torch.tensor([R.FAMILIES[s.family[i]] != "passkey" for i in rows])] = 0
            return torch.nn.functional.one_hot(y, vocab).float(), None

    m = tasks.evaluate(PasskeyOracle(), task, micro_batch=7, device="cpu")
    for s in task.evals:
        share = float(np.mean([R.FAMILIES[f] == "passkey" for f in s.family]))
        assert 0 < share < 1 and m["curve"][s.length] == pytest.approx(share)
    assert m["curve_family"] == {f: {256: float(f == "passkey"), 384: float(f == "passkey")} for f in R.FAMILIES}


def test_mode_retrieval_writes_the_record_figures_and_table(run, tmp_path, capsys):
    out = tmp_path / "r.json"
    res = eval_lib.run(compose([f"ckpt=[{run},{run}]", "mode=retrieval", "retrieval.lengths=[192,256]",
                                "retrieval.depths=3", "retrieval.samples=1", "retrieval.tasks=[passkey,niah_single]",
                                f"out={out}", "device=cpu"], "eval"))
    printed = capsys.readouterr().out
    assert "| model | task | 192 | 256 |" in printed and "seconds per checkpoint" in printed
    assert out.with_suffix(".png").read_bytes()[:8] == PNG
    assert (tmp_path / "r_by_length.png").read_bytes()[:8] == PNG
    rec = json.loads(out.read_text())
    name = next(iter(rec["summary"]))
    assert len(rec["examples"][name]) == 2 * 2 * 3 and rec["settings"]["per_checkpoint"][name]["haystack"] == "noise"
    assert rec["settings"]["per_checkpoint"][name]["digits"] == 4  # the model's own task's
    assert set(rec["summary"][name]["heatmap"]) == {f"{d}@{L}" for d in ("0.00", "0.50", "1.00") for L in (192, 256)}
    assert res["train_len"][name] == 192


@pytest.mark.slow
def test_the_lm_eval_route_gives_mode_retrievals_scores(run, tmp_path):
    """The same examples through lm-eval: the console script on an export, from another directory (task files found
    beside their YAML), and eval.py mode=lm_eval on the checkpoint, against mode=retrieval: every prediction, the
    string match, the teacher-forced greedy share and the mean log-probability."""
    from duality.hf import export
    lengths, tasks = [192, 256], ["passkey", "niah_multikey"]
    own = eval_lib.run(compose([f"ckpt={run}", "mode=retrieval", f"retrieval.lengths={lengths}",
                                f"retrieval.tasks=[{','.join(tasks)}]", "retrieval.depths=3", "retrieval.samples=2",
                                f"out={tmp_path / 'own.json'}", "device=cpu"], "eval"))
    name = next(iter(own["summary"]))
    folder = tmp_path / "tasks"
    RV.main(["tasks", str(run), str(folder), "--tasks", *tasks, "--lengths", *map(str, lengths), "--depths", "3",
             "--samples", "2", "--haystack", "noise", "--digits", "4"])
    hf = export(str(run), tmp_path / "hf")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = subprocess.run([str(Path(sys.executable).parent / "lm_eval"), "--model", "hf", "--model_args",
                        f"pretrained={hf},trust_remote_code=True,max_length=512", "--include_path", str(folder),
                        "--tasks", "retrieval,retrieval_ll", "--device", "cpu", "--batch_size", "4", "--log_samples",
                        "--output_path", str(tmp_path / "cli")], cwd=elsewhere, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    cli = json.loads(next((tmp_path / "cli").rglob("results_*.json")).read_text())["results"]
    via_eval = eval_lib.run(compose([f"ckpt={run}", "mode=lm_eval", f"lm_eval.include_path={folder}", "device=cpu",
                                     "lm_eval.tasks=[retrieval,retrieval_ll]", "lm_eval.max_length=512",
                                     f"out={tmp_path / 'lm.json'}"], "eval"))["results"][str(run)]
    cells = own["summary"][name]["cells"]
    for f in tasks:
        for L in lengths:
            want = cells[f"{f}@{L}"]
            for got in (cli, via_eval):
                assert got[f"retrieval_{f}_{L}"]["string_match,none"] == pytest.approx(want["string_match"])
                assert got[f"retrieval_{f}_{L}_ll"]["greedy,none"] == pytest.approx(want["greedy"])
                assert got[f"retrieval_{f}_{L}_ll"]["logprob,none"] == pytest.approx(want["logprob"], rel=1e-4)
            samples = [json.loads(line) for p in (tmp_path / "cli").rglob(f"samples_retrieval_{f}_{L}_*.jsonl")
                       if "_ll_" not in p.name for line in p.read_text().splitlines()]
            preds = sorted(str(np.ravel(s["filtered_resps"])[0]).strip() for s in samples)
            mine = sorted(e["prediction"] for e in own["examples"][name] if e["family"] == f and e["length"] == L)
            assert preds == mine and len(mine) == 6


def test_refusals_are_one_line(run, bpe, tmp_path, capsys):
    """A length past an absolute scheme's positions, an unknown task, a haystack file too short: each a ConfigError
    of one line, before any example is scored; the task-file command says its refusals as one `error:` line, exit 2,
    nothing written (it printed a traceback)."""
    for args, words in (([str(run), "--lengths", "16"], ["passkey", "16 tokens cannot hold"]),
                        ([str(run), "--tasks", "needle"], ["argument --tasks", "needle", "niah_single"]),
                        ([str(tmp_path / "none"), "--haystack", "text"], ["argument --haystack", "'text'", "noise"]),
                        ([str(run), "--values", "letters"], ["argument --values", "letters", "words"]),
                        ([str(tmp_path / "none")], ["no checkpoint there"])):
        with pytest.raises(SystemExit) as e:
            RV.main(["tasks", args[0], str(tmp_path / "tasks"), *args[1:]])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
        assert all(w in err for w in words) and "Traceback" not in err, err
        assert not (tmp_path / "tasks").exists()
    with pytest.raises(SystemExit) as e:  # plot: a record that is not there
        RV.main(["plot", str(tmp_path / "none.json"), str(tmp_path / "fig.png")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and "none.json" in err and "Traceback" not in err, err

    def refused(overrides, *words):
        with pytest.raises(ConfigError) as e:
            eval_lib.run(compose(["mode=retrieval", "device=cpu", *overrides], "eval"))
        msg = str(e.value)
        assert "\n" not in msg and all(w in msg for w in words), msg
    refused([f"ckpt={run}", "retrieval.tasks=[passkey,needle]"], "needle", "niah_single")
    refused([f"ckpt={run}", "retrieval.haystack=essays"], "essays", "repeat")
    learned = tmp_path / "learned"
    from conftest import tiny_overrides as t
    train_lib.run(compose(t(learned, tmp_path / "cache", "pe=learned", "train.steps=1", "model.seq_len=64")))
    refused([f"ckpt={learned}", "retrieval.lengths=[1024]"], "pe=learned", "64 positions", "1024")
    short = tmp_path / "short.txt"
    short.write_text("One sentence. Another one. A third.")
    refused([f"ckpt={bpe}", "retrieval.haystack=text", "data=text", f"data.files={short}", "retrieval.lengths=[512]"],
            "haystack holds", "512")
    refused([f"ckpt={bpe}", "retrieval.haystack=text"], "data=text")
