"""What a new user runs into (issue #76's snags, tried as the README's recipes on a CPU): each answered in one line
that says what to do, or fixed. The other snags' tests sit with their subjects: a resume's changed setting named
(test_train.py), srun's threads (test_slurm.py), one text document (test_data.py)."""

import os
import re
import subprocess
import sys

import pytest

from duality import eval as eval_lib
from duality import train as train_lib
from duality.common.cli import check_choices
from conftest import ROOT, compose, tiny_overrides

LOCAL = str(ROOT / "evals" / "local_tasks")


def test_a_choice_that_names_no_config_is_one_line_with_close_matches():
    """pe=ropee listed Hydra's 34 lines of options, the internal *_schema entries among them; pe=alibi_schema
    trained. Both are now one line naming the valid choices (no schema), with the close ones first."""
    why = check_choices(["pe=ropee"])
    assert why.startswith("pe=ropee: no such pe config; did you mean rope or vo_rope or nope? valid choices: alibi,")
    assert "_schema" not in why and "\n" not in why
    assert check_choices(["pe=alibi_schema"]).startswith("pe=alibi_schema: no such pe config;")
    assert check_choices(["backbone=gla", "pe=rope", "model=370m", "data.files=x.txt", "+arch=sympow"]) is None
    assert check_choices(["pe=nope,rope,selective_rope", "hydra/launcher=gpus", "pe=choice(a,b)"]) is None
    assert check_choices(["-m", "pe=nope,ropr"]).startswith("pe=ropr: no such pe config; did you mean rope?")


@pytest.mark.slow
def test_the_command_line_refuses_an_unknown_choice_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "train.py"), "pe=alibi_schema", f"out_dir={tmp_path}"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: pe=alibi_schema:"), r.stderr
    assert not list(tmp_path.iterdir())  # refused before any work


@pytest.mark.slow
def test_local_lm_eval_tasks_run_from_another_directory(tmp_path, data_cache, monkeypatch):
    """evals/local_tasks' YAMLs read their JSONL from their own folder: `--include_path /abs/evals/local_tasks`
    from another directory found no file (FileNotFoundError), as the YAML named it relative to the current one."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    run = tmp_path / "run"
    train_lib.run(compose(tiny_overrides(run, data_cache, "train.steps=2", "model.seq_len=64")))
    monkeypatch.chdir(tmp_path)
    res = eval_lib.run(compose([f"ckpt={run}", "mode=lm_eval", f"lm_eval.include_path={LOCAL}", "device=cpu",
                                "lm_eval.tasks=[pydoc_mc,pydoc_complete]", "lm_eval.limit=4",
                                "lm_eval.max_length=256", f"out={tmp_path / 'lm.json'}"], "eval"))
    scores = res["results"][str(run)]
    assert 0 <= scores["pydoc_mc"]["acc,none"] <= 1 and "exact_match,none" in scores["pydoc_complete"]


@pytest.mark.parametrize("world, micro", [(1, 8), (2, 4), (4, 2), (8, 1)])
def test_the_default_config_divides_over_1_2_4_and_8_ranks_unchanged(world, micro, monkeypatch, capsys):
    """`torchrun --nproc_per_node=2 train.py` raised the default global batch from 2,048 to 4,096 tokens: the README
    promises the same run on any number of GPUs. The default micro-batch now shrinks instead, with a note; the
    global batch stays. A micro-batch given on the command line is kept (then the batch rounds up, said once)."""
    from duality.trainer import config as C
    monkeypatch.setattr(C, "given", lambda key: False)  # nothing on the command line: the defaults
    cfg = compose([])
    plan = C.check_config(cfg, world)
    assert cfg.train.global_batch_tokens == 2048 and cfg.train.micro_batch == micro
    assert plan["batch_tokens"] == 2048 and plan["grad_accum"] == 2048 // (micro * cfg.model.seq_len * world)
    assert ("note: train.micro_batch 8 -> " in capsys.readouterr().err) == (world > 1)
    monkeypatch.setattr(C, "given", lambda key: key == "train.micro_batch")
    cfg = compose(["train.micro_batch=3"])
    C.check_config(cfg, 2)
    assert cfg.train.micro_batch == 3 and cfg.train.global_batch_tokens == 2 * 3 * cfg.model.seq_len * 2


def test_eval_on_a_run_or_its_export_reads_the_runs_data_cache(tmp_path):
    """eval.py ckpt=<export> tokenized the corpus again into a second cache folder (its tokenizer key differed from
    the run's) although the shards were byte-identical: the run's cache is used whenever its tokenizer is the
    checkpoint's; another tokenizer still gets a folder of its own."""
    from duality import data as data_lib
    from duality.hf import export
    cache = tmp_path / "cache"
    run = tmp_path / "run"
    train_lib.run(compose(tiny_overrides(run, cache, "train.steps=2")))
    before = sorted(p.name for p in cache.iterdir())
    assert len(before) == 1
    hf = export(str(run), tmp_path / "hf")
    for ckpt in (run, hf):
        eval_lib.run(compose([f"ckpt={ckpt}", "mode=perplexity", "eval_tokens=256", "device=cpu",
                              f"out={tmp_path / 'p.json'}"], "eval"))
        assert sorted(p.name for p in cache.iterdir()) == before
    cfg = dict(eval_lib.load_model(str(run))[2]["config"]["data"])
    data_lib.prepare(cfg, progress=False, tokenizer=data_lib.Tokenizer("byte"))
    assert len(list(cache.iterdir())) == 2


@pytest.mark.slow
def test_collect_sweep_reads_a_language_model_sweep(tmp_path, data_cache):
    """collect_sweep.py on a finished text sweep said "no task_eval.json ... did the sweep's runs finish?": it now
    tables every run by its validation loss (what the sweep varied, last and best loss, perplexity, tokens) and
    draws the loss curves."""
    args = [a for a in tiny_overrides(tmp_path / "unused", data_cache, "train.steps=4", "train.eval_interval=2")
            if not a.startswith("out_dir=")]
    r = subprocess.run([sys.executable, "train.py", "-m", "pe=nope,rope", f"hydra.sweep.dir={tmp_path}/sw", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([sys.executable, "scripts/collect_sweep.py", str(tmp_path / "sw")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    table = (tmp_path / "sw" / "results_lm.md").read_text().splitlines()
    assert table[2] == "| run | pe.name | step | val_loss | val_ppl | best_val_loss | tokens |"
    rows = [line for line in table[4:] if line.startswith("| transformer + ")]
    assert len(rows) == 2 and {row.split(" | ")[1] for row in rows} == {"nope", "rope"}
    assert all(row.split(" | ")[2] == "4" for row in rows)
    assert (tmp_path / "sw" / "results_lm.png").stat().st_size > 1000
    empty = tmp_path / "empty"
    empty.mkdir()
    r = subprocess.run([sys.executable, "scripts/collect_sweep.py", str(empty)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode != 0 and "neither a task_eval.json" in r.stderr


@pytest.mark.slow
def test_an_exports_tokenizer_loads_as_the_docs_say_without_a_remote_code_prompt(tmp_path, data_cache):
    """AutoTokenizer.from_pretrained(export) without trust_remote_code stopped at transformers' [y/N] prompt: it reads
    config.json (whose auto_map names remote code) before the tokenizer. docs/evaluation.md answers it: the line it
    gives, run as written in a fresh process (no import of duality, stdin closed: a prompt would fail), loads the
    run's ids; AutoTokenizer with trust_remote_code=True gives the same; without it transformers prints its question
    (naming trust_remote_code=True), cannot read an answer, and loads the same tokenizer anyway, as the docs say."""
    from duality.hf import export
    doc = (ROOT / "docs" / "evaluation.md").read_text()
    documented = re.search(r"`(PreTrainedTokenizerFast\.from_pretrained\(export\))`", doc)
    assert documented, "docs/evaluation.md no longer says how to load an export's tokenizer alone"
    run = tmp_path / "run"
    train_lib.run(compose(tiny_overrides(run, data_cache, "train.steps=1")))
    hf = export(str(run), tmp_path / "hf")
    probe = ("import sys, json; from transformers import PreTrainedTokenizerFast, AutoTokenizer; export = sys.argv[1]; "
             f"a = {documented.group(1)}; imported = 'duality' in sys.modules; "
             "c = AutoTokenizer.from_pretrained(export); "  # asked first: loaded remote code would silence the prompt
             "b = AutoTokenizer.from_pretrained(export, trust_remote_code=True); t = 'The module provides'; "
             "print('\\nRESULT', json.dumps([a(t).input_ids, b(t).input_ids, c(t).input_ids, imported]))")
    r = subprocess.run([sys.executable, "-c", probe, str(hf)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    import json
    prompt, result = r.stdout.rsplit("RESULT", 1)
    a, b, c, imported = json.loads(result)
    assert a == b == c == eval_lib.load_model(str(run))[1].encode("The module provides")
    assert imported is False
    # without trust_remote_code transformers asks (here unanswerable: no terminal), then loads the tokenizer anyway
    assert "[y/N]" in prompt and "trust_remote_code=True" in prompt
