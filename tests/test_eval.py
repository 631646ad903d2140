"""eval.py's modes as a user runs them: lm-evaluation-harness scoring (network off, local task files), the loss by
position and its plot, the relative-position kernel pictures, and their errors. Each number is checked against an
independent computation: the model's own log-probabilities, greedy decoding by repeated full forwards."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from duality import eval as eval_lib
from duality import train as train_lib
from duality.model import ConfigError, build_model
from conftest import ROOT, compose, tiny_overrides

os.environ["HF_DATASETS_OFFLINE"] = "1"  # with HF_HUB_OFFLINE (conftest): the harness cannot reach the network
LOCAL = str(ROOT / "evals" / "local_tasks")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, data_cache):
    """A tiny transformer trained for 40 steps on the embedded corpus."""
    out = tmp_path_factory.mktemp("run")
    train_lib.run(compose(tiny_overrides(out, data_cache, "train.steps=40", "model.seq_len=64")))
    return out


@pytest.fixture(scope="module")
def lm(ckpt):
    """The harness's own HFLM on the checkpoint as a transformers model (hf.py), in float64; beside it the trunk
    (GPT) and the repo's tokenizer, for the oracles."""
    from duality.evals.harness import hflm
    from duality.hf import DualityForCausalLM
    model, tokenizer = DualityForCausalLM.from_checkpoint(str(ckpt))
    h = hflm(model.double(), tokenizer, batch_size=3)
    h.gpt, h.tok = model.model, eval_lib.load_model(str(ckpt))[1]
    return h


def requests(kind, *args_list):
    from lm_eval.api.instance import Instance
    return [Instance(request_type=kind, doc={}, arguments=a, idx=0) for a in args_list]


def direct_logprob(model, ids: list[int]) -> list[float]:
    """log p(ids[t] | ids[:t]) for t >= 1, by one plain forward pass."""
    logits, _ = model(torch.tensor([ids]))
    return F.log_softmax(logits[0, :-1].double(), -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


@pytest.mark.slow
def test_loglikelihood_equals_summed_token_logprobs(lm):
    """HFLM's scores are the trunk's own log-probabilities: the context's trailing spaces move to the continuation,
    inputs longer than max_length keep their last tokens, an empty context is end-of-text."""
    tok = lm.tok
    reqs = [("The module", " provides functions"), ("Return the", " value of x."), ("", "Hello world"),
            ("A very long context " * 30, " end")]  # the last one exceeds max_length = 64 and is cut on the left
    assert lm.max_length == 64
    got = lm.loglikelihood(requests("loglikelihood", *reqs), disable_tqdm=True)
    for (ctx, cont), (ll, greedy) in zip(reqs, got):
        ctx_ids = tok.encode(ctx.rstrip(" ")) if ctx else [tok.eot_id]  # trailing spaces go to the continuation
        whole = tok.encode(ctx + cont) if ctx else ctx_ids + tok.encode(cont)
        ids = whole[-(lm.max_length + 1):]
        n_cont = len(whole) - len(ctx_ids)
        lp = direct_logprob(lm.gpt, ids)[-n_cont:]
        assert ll == pytest.approx(sum(lp), rel=1e-9, abs=1e-9)
        assert isinstance(greedy, bool)
    # a continuation that is the model's own greedy choice is reported as greedy
    nxt = lm.gpt(torch.tensor([tok.encode("The module")]))[0][0, -1].argmax().item()
    (_, greedy), = lm.loglikelihood(requests("loglikelihood", ("The module", tok.decode([nxt]))), disable_tqdm=True)
    assert greedy is (tok.encode("The module" + tok.decode([nxt])) == tok.encode("The module") + [nxt])


def test_the_batched_scorer_gives_hflms_results_with_one_forward_per_distinct_row(lm, monkeypatch):
    """evals/harness.py's subclass against the harness's own HFLM._loglikelihood_tokens on the same requests: equal
    log-likelihoods (float64) and greedy flags, in the requests' order; choices that differ only in their last
    token share one row, so four one-token choices cost one forward."""
    from lm_eval.models.huggingface import HFLM
    tok = lm.tok
    ctx = tok.encode("Return the value of")
    choices = [((None, None), ctx, [t]) for t in (259, 264, 300, 301)]  # one-token choices: one row
    reqs = [("The module", " provides functions"), ("A very long context " * 30, " end"), ("Hello", " world and more")]
    enc = choices + [((c, x), tok.encode(c), tok.encode(c + x)[len(tok.encode(c)):]) for c, x in reqs]
    calls = []
    real = type(lm)._forward
    monkeypatch.setattr(type(lm), "_forward", lambda self, inps, *a: calls.append(inps.shape) or real(self, inps, *a))
    got = lm._loglikelihood_tokens(enc, disable_tqdm=True)
    want = HFLM._loglikelihood_tokens(lm, enc, disable_tqdm=True)
    assert [g for _, g in got] == [w for _, w in want]
    for (a, _), (b, _) in zip(got, want):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-9)
    calls.clear()
    lm._loglikelihood_tokens(choices, disable_tqdm=True)
    # one row for the four choices, as long as the context (on a GPU: padded to a multiple of 64)
    width = len(ctx) if lm.device.type != "cuda" else min(-(-len(ctx) // 64) * 64, lm.max_length)
    assert calls == [torch.Size([1, width])]


def test_the_batched_scorer_tokenizes_as_hflm(lm, monkeypatch):
    """The subclass's loglikelihood encodes all requests in two calls of the Rust tokenizer (each distinct context
    once); the (context, continuation) token lists it hands on are HFLM's own: trailing whitespace moved to the
    continuation, choices sharing a context (with and without its trailing space), non-ASCII text, a context longer
    than max_length. An empty context takes HFLM's path (end-of-text as context)."""
    from lm_eval.models.huggingface import HFLM
    seen = []
    monkeypatch.setattr(type(lm), "_loglikelihood_tokens", lambda self, reqs, **kw: seen.append(reqs) or
                        [(0.0, False)] * len(reqs))
    reqs = [("The module ", "provides functions"), ("Return the\n\t", " value of x."), ("naïve café", " → π"),
            ("A very long context " * 30, " end"), ("Hello", " world"), ("The module ", "returns"),
            ("The module", " is gone"), ("Hello", "!")]
    for batch in (reqs, reqs + [("", "Hello world")]):
        seen.clear()
        lm.loglikelihood(requests("loglikelihood", *batch), disable_tqdm=True)
        HFLM.loglikelihood(lm, requests("loglikelihood", *batch), disable_tqdm=True)
        assert len(seen) == 2 and seen[0] == seen[1] and len(seen[0]) == len(batch)
    assert seen[0][0][1:] == (lm.tok.encode("The module"), lm.tok.encode(" provides functions"))


def test_rolling_loglikelihood_scores_every_token_once(lm):
    text = "Return a new list containing all items from the iterable in ascending order. " * 4
    ids = lm.tok.encode(text)
    assert len(ids) > lm.max_length  # several windows
    (ll,) = lm.loglikelihood_rolling(requests("loglikelihood_rolling", (text,)), disable_tqdm=True)
    # oracle, the harness's rule: blocks of L predictions, each from the block's own tokens ([eot] first), except the
    # last block, which gets a full window of L tokens of context
    L, N, seq = lm.max_length, len(ids), [lm.tok.eot_id] + ids
    expect = 0.0
    for i in range(N):  # predict seq[i + 1] = ids[i]
        start = L * (i // L) if L * (i // L) + L < N else max(0, N - L)
        logits, _ = lm.gpt(torch.tensor([seq[start:i + 1]]))
        expect += F.log_softmax(logits[0, -1].double(), -1)[seq[i + 1]].item()
    assert ll == pytest.approx(expect, rel=1e-9)


def test_generate_until_through_the_cache_equals_repeated_full_forwards(lm):
    """HFLM batches prompts of several lengths, left-padded; each row decodes as its prompt alone would."""
    prompts = ["The function", "Return the", "The module x"]
    out = lm.generate_until(requests("generate_until", *[(p, {"until": ["\n\n"], "max_gen_toks": 12})
                                                          for p in prompts]), disable_tqdm=True)
    for p, text in zip(prompts, out):
        seq = lm.tok.encode(p)
        for _ in range(12):  # greedy by full forwards, no cache
            seq.append(lm.gpt(torch.tensor([seq]))[0][0, -1].argmax().item())
        new = seq[len(lm.tok.encode(p)):]
        if lm.tok.eot_id in new:
            new = new[:new.index(lm.tok.eot_id)]
        assert text == lm.tok.decode(new).split("\n\n")[0]
    # a stop string cuts the text there: stop at a piece of what the model writes without one
    full, = lm.generate_until(requests("generate_until", (prompts[0], {"until": [], "max_gen_toks": 12})),
                              disable_tqdm=True)
    assert len(full) >= 4, full
    stop = full[len(full) // 2:len(full) // 2 + 2]
    cut, = lm.generate_until(requests("generate_until", (prompts[0], {"until": [stop], "max_gen_toks": 12})),
                             disable_tqdm=True)
    assert cut == full[:full.index(stop)]


@pytest.mark.slow
def test_export_loads_with_the_auto_classes_and_scores_through_the_harness_cli(ckpt, tmp_path, monkeypatch):
    """eval.py mode=export writes a folder that AutoModelForCausalLM / AutoTokenizer load (same logits, same ids as
    the checkpoint), and `python -m duality.evals.harness --model hf` (and `hf-batched`) scores it as eval.py
    mode=lm_eval scores the checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    monkeypatch.chdir(ROOT)  # the task YAMLs name their JSONL files relative to the repo root
    out = tmp_path / "export"
    eval_lib.run(compose([f"ckpt={ckpt}", "mode=export", f"out={out}"], "eval"))
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind
    gpt, tok, _ = eval_lib.load_model(str(ckpt))
    model, auto_tok = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    text = "Return the value of x."
    ids = auto_tok(text, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == tok.encode(text)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, gpt(ids)[0], rtol=0, atol=0)
    # exporting again replaces the folder; a folder that is not an export is refused
    eval_lib.run(compose([f"ckpt={ckpt}", "mode=export", f"out={out}", "dtype=bfloat16"], "eval"))
    assert AutoModelForCausalLM.from_pretrained(out).dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="not an earlier export"):
        eval_lib.run(compose([f"ckpt={ckpt}", "mode=export", f"out={ROOT / 'conf'}"], "eval"))
    eval_lib.run(compose([f"ckpt={ckpt}", "mode=export", f"out={out}"], "eval"))  # float32 again
    # max_length past the 64-token training context: HFLM refuses a continuation longer than max_length
    res = eval_lib.run(compose([f"ckpt={ckpt}", "mode=lm_eval", f"lm_eval.include_path={LOCAL}", "device=cpu",
                                "lm_eval.tasks=[pydoc_mc]", "lm_eval.limit=16", "lm_eval.max_length=256"], "eval"))
    own = res["results"][str(ckpt)]["pydoc_mc"]
    for scorer in ("hf", "hf-batched"):  # the harness's HFLM, and this repo's batched subclass of it
        r = subprocess.run([sys.executable, "-m", "duality.evals.harness", "--model", scorer, "--model_args",
                            f"pretrained={out},max_length=256", "--tasks", "pydoc_mc", "--include_path", LOCAL,
                            "--limit", "16", "--device", "cpu", "--batch_size", "4",
                            "--output_path", str(tmp_path / scorer)],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        cli = json.loads(next((tmp_path / scorer).rglob("results_*.json")).read_text())["results"]["pydoc_mc"]
        assert cli["acc,none"] == own["acc,none"] and cli["acc_norm,none"] == own["acc_norm,none"], scorer


@pytest.mark.slow
def test_lm_eval_simple_evaluate_on_local_tasks_offline(ckpt, monkeypatch):
    """A multiple-choice, a rolling-loglikelihood and a generate_until task, from local JSONL, through eval.py
    (HFLM and lm_eval.simple_evaluate underneath) with the hub unreachable."""
    monkeypatch.chdir(ROOT)  # the task YAMLs name their JSONL files relative to the repo root
    res = eval_lib.run(compose([f"ckpt={ckpt}", "mode=lm_eval", f"lm_eval.include_path={LOCAL}",
                                "lm_eval.tasks=[pydoc_mc,pydoc_ppl,pydoc_complete]", "lm_eval.limit=24",
                                "lm_eval.max_length=256", "device=cpu"], "eval"))
    r = res["results"][str(ckpt)]
    assert 0 <= r["pydoc_mc"]["acc,none"] <= 1 and 0 <= r["pydoc_complete"]["exact_match,none"] <= 1
    assert 1 < r["pydoc_ppl"]["word_perplexity,none"] < float("inf")
    row = next(iter(res["table"].values()))
    assert row["avg acc"] == pytest.approx((row["pydoc_mc acc"] + row["pydoc_complete exact_match"]) / 2)
    table = (ckpt / "eval_lm_eval.md").read_text()
    assert table.startswith("| model | pydoc_mc acc | pydoc_mc acc_norm |") and "transformer + rope" in table
    assert json.loads((ckpt / "eval_lm_eval.json").read_text())["tasks"] == ["pydoc_mc", "pydoc_ppl", "pydoc_complete"]
    # the table's accuracy is the mean over examples of "the true choice has the highest log-likelihood", with
    # log-likelihoods from the trunk's own forward
    gpt, tok, _ = eval_lib.load_model(str(ckpt))
    docs = [json.loads(line) for line in open(ROOT / "evals/local_tasks/pydoc_mc.jsonl")][:24]
    correct = 0
    for d in docs:
        ctx = tok.encode(d["context"].rstrip(" "))
        lls = []
        for c in d["choices"]:
            whole = tok.encode(d["context"] + c)
            lls.append(sum(direct_logprob(gpt, whole)[len(ctx) - 1:]))
        correct += max(range(4), key=lambda i: lls[i]) == d["label"]
    assert r["pydoc_mc"]["acc,none"] == pytest.approx(correct / len(docs))


def test_lm_eval_errors_name_the_problem(ckpt, tmp_path, monkeypatch):
    from duality.evals.harness import load_tasks
    monkeypatch.chdir(ROOT)
    # a task whose dataset lives on the hub, with the network off
    (tmp_path / "hub_task.yaml").write_text(
        "task: hub_task\ndataset_path: nobody/not_a_dataset\ntest_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: q\ndoc_to_choice: c\ndoc_to_target: 0\n")
    with pytest.raises(ConfigError, match=r"'hub_task' cannot load its data.*dataset_path='nobody/not_a_dataset'"):
        load_tasks(["hub_task"], str(tmp_path))
    with pytest.raises(ConfigError, match="no checkpoint there"):
        eval_lib.run(compose([f"ckpt={tmp_path}/missing", "mode=lm_eval"], "eval"))
    # CUDA graphs on a CPU: refused before any task or model loads ('nope' would fail to load otherwise)
    with pytest.raises(ConfigError, match=r"lm_eval.cuda_graphs=true needs a CUDA device; this run's is cpu"):
        eval_lib.run(compose([f"ckpt={ckpt}", "mode=lm_eval", "device=cpu", "lm_eval.cuda_graphs=true",
                              "lm_eval.tasks=[nope]"], "eval"))
    with pytest.raises(ConfigError, match=r"lm_eval.cuda_graphs='sometimes'; valid choices: auto, true, false"):
        eval_lib.run(compose([f"ckpt={ckpt}", "mode=lm_eval", "lm_eval.cuda_graphs=sometimes",
                              "lm_eval.tasks=[nope]"], "eval"))


def test_cuda_graphs_need_a_cuda_device_and_this_repos_model(lm):
    """The batched scorer runs this repo's model by hidden_states and logits_at (the head at the scored positions
    only); cuda_graphs=auto (the default) runs it eagerly on a CPU, True is refused there, naming the device, and
    a value that is none of auto/True/False is refused."""
    from duality.evals.harness import batched_hflm, hflm
    assert lm.trunk == lm.model.hidden_states
    with pytest.raises(ConfigError, match="cuda_graphs='yes'; valid choices: auto, True, False"):
        hflm(lm.model, lm.tokenizer, cuda_graphs="yes")
    with pytest.raises(ConfigError, match="cuda_graphs=True needs this repo's model .* on a CUDA device; got "
                                          "DualityForCausalLM on cpu"):
        hflm(lm.model, lm.tokenizer, cuda_graphs=True)
    assert isinstance(lm, batched_hflm())


@pytest.mark.slow
def test_unknown_lm_eval_task_lists_close_matches():
    from duality.evals.harness import load_tasks
    with pytest.raises(ConfigError, match=r"unknown lm_eval task\(s\) \['hellaswagg'\].*'hellaswag'"):
        load_tasks(["hellaswagg"])


@pytest.mark.slow
def test_position_loss_json_and_png(ckpt, tmp_path):
    res = eval_lib.run(compose([f"ckpt={ckpt}", "mode=position_loss", "position_loss.length=256",
                                "position_loss.max_windows=3", "position_loss.chunk=100", f"out={tmp_path}/pl.json"],
                               "eval"))
    (curve,) = res["curves"].values()
    assert curve["length"] == 256 and curve["windows"] == 3 and curve["train_len"] == 64
    assert curve["positions"][0] == 1 and curve["positions"][-1] < 256 and len(curve["positions"]) > 20
    saved = json.loads((tmp_path / "pl.json").read_text())
    assert saved["curves"] == json.loads(json.dumps(res["curves"]))
    assert (tmp_path / "pl.png").read_bytes()[:8] == PNG
    # the curve is the per-position loss: check it against one unchunked forward over the same windows
    from duality import data as data_lib
    model, tok, ck = eval_lib.load_model(str(ckpt))
    info = data_lib.prepare(ck["config"]["data"], progress=False, tokenizer=tok)
    x, y = data_lib.TokenWindows(info.val_shards, 256, tok.vocab_size, shuffle=False).batch(range(3))
    with torch.no_grad():
        loss = F.cross_entropy(model(x)[0].transpose(1, 2), y, reduction="none").double().mean(0)
    assert curve["loss"][0] == pytest.approx(loss[0].item(), rel=1e-4)
    avg = next(iter(saved["curves"].values()))["avg_up_to"]
    assert avg["256"] == pytest.approx(loss.mean().item(), rel=1e-4)
    assert avg["16"] == pytest.approx(loss[:16].mean().item(), rel=1e-4)


def test_position_loss_refuses_lengths_the_model_or_data_cannot_give(ckpt, tmp_path, data_cache):
    with pytest.raises(ConfigError, match="validation tokens"):
        eval_lib.run(compose([f"ckpt={ckpt}", "mode=position_loss", "position_loss.length=10000000"], "eval"))
    learned = tmp_path / "learned"
    train_lib.run(compose(tiny_overrides(learned, data_cache, "train.steps=1", "pe=learned")))
    with pytest.raises(ConfigError, match="pe=learned has positions 0..31 only"):
        eval_lib.run(compose([f"ckpt={learned}", "mode=position_loss", "position_loss.length=128"], "eval"))


def test_perplexity_of_several_checkpoints_plots_loss_vs_training_context(ckpt, tmp_path, data_cache):
    short = tmp_path / "short"
    train_lib.run(compose(tiny_overrides(short, data_cache, "train.steps=2")))
    res = eval_lib.run(compose([f"ckpt=[{ckpt},{short}]", "mode=perplexity", "eval_tokens=512",
                                f"out={tmp_path}/ppl.json"], "eval"))
    assert sorted(r["seq_len"] for r in res.values() if isinstance(r, dict)) == [32, 64]
    assert (tmp_path / "ppl.png").read_bytes()[:8] == PNG


@pytest.mark.slow
def test_kernel_pictures_show_the_duality(tmp_path):
    """ALiBi's log-weight is -m_h n exactly; RetNet's is n log gamma_h; RoPE's rotation factor is mean_i cos(n theta_i);
    NoPE is flat; fresh and trained models draw one PNG."""
    from duality.kernels.rotary import rope_frequencies
    from duality.model.mixers.scalar_decay import retnet_gammas
    from duality.model.pe.alibi import alibi_slopes
    res = eval_lib.run(compose(["mode=kernel", "kernel.fresh=[transformer/alibi,retnet/nope,transformer/rope,"
                                "transformer/nope,fox/nope,gla/selective_rope]", "kernel.length=40",
                                f"out={tmp_path}/k.json", "wandb=true"], "eval"))
    k = {n.split(" (")[0]: v for n, v in res["kernels"].items()}
    n = torch.arange(40, dtype=torch.float64)
    H = len(k["transformer + alibi"]["log-weight"])
    torch.testing.assert_close(torch.tensor(k["transformer + alibi"]["log-weight"], dtype=torch.float64),
                               -alibi_slopes(H).double()[:, None] * n)
    torch.testing.assert_close(torch.tensor(k["retnet + nope"]["log-weight"], dtype=torch.float64),
                               torch.log(retnet_gammas(H))[:, None] * n, rtol=1e-6, atol=1e-6)
    head_dim = 256 // H  # model=tiny
    theta = rope_frequencies(head_dim, 10000.0).double()
    rot = torch.tensor(k["transformer + rope"]["rotation"], dtype=torch.float64)
    torch.testing.assert_close(rot, torch.cos(n[:, None] * theta[None]).mean(-1).expand(H, -1), rtol=1e-5, atol=1e-5)
    assert torch.tensor(k["transformer + nope"]["log-weight"]).abs().max() == 0
    fox = torch.tensor(k["fox + nope"]["log-weight"])
    assert (fox[:, 1:] < 0).all() and (fox.diff(dim=1) <= 0).all()  # a forget gate only ever forgets
    assert set(k["gla + selective_rope"]) == {"log-weight", "rotation"}
    assert (tmp_path / "k.png").read_bytes()[:8] == PNG
    assert list((tmp_path / "wandb").glob("offline-run-*/files/media/images/kernel_*.png"))  # logged, offline
    with pytest.raises(ConfigError, match="unknown backbone 'transformers'"):
        eval_lib.run(compose(["mode=kernel", "kernel.fresh=[transformers/rope]"], "eval"))


def test_every_backbone_has_a_kernel_picture():
    from duality.evals.pe_kernel import relative_kernel
    from duality.model.mixers import REGISTRY
    for name in sorted(REGISTRY):
        m = build_model({"name": name}, {"name": "nope"},
                        {"n_layer": 1, "d_model": 32, "n_heads": 2, "seq_len": 16}, 64)
        k = relative_kernel(m.eval(), torch.randint(0, 64, (2, 16)))
        assert k["log-weight"].shape == (2, 16) and torch.isfinite(k["log-weight"]).all(), name
        has_gate = m.blocks[0].mixer.log_gate(torch.zeros(1, 16, 32)) is not None
        assert bool(k["log-weight"][:, 1:].abs().sum() > 0) == has_gate, name


def test_export_replaces_only_its_own_folders_and_clears_killed_exports(ckpt, tmp_path):
    """A downloaded model's folder (config.json, pytorch_model.bin, README.md) is refused with one error and left as
    it was; an earlier export is replaced; the hidden folders of an export killed mid-write are removed."""
    from duality.hf import EXPORT_MARKER, export
    foreign = tmp_path / "downloaded"
    foreign.mkdir()
    for name, text in (("config.json", '{"model_type": "llama"}'), ("pytorch_model.bin", "weights"),
                       ("README.md", "mine")):
        (foreign / name).write_text(text)
    with pytest.raises(ConfigError, match=r"out=.*downloaded is not an earlier export of this repo \(holds "
                                          r"README.md, config.json, pytorch_model.bin; no duality_export.json\)"):
        export(str(ckpt), foreign)
    assert sorted(p.name for p in foreign.iterdir()) == ["README.md", "config.json", "pytorch_model.bin"]
    out = tmp_path / "hf"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for kind in ("tmp", "old"):  # what a killed export leaves beside its target
        (tmp_path / f".hf.{kind}.{dead.pid}").mkdir()
        (tmp_path / f".hf.{kind}.{dead.pid}" / "config.json").write_text("{}")
    export(str(ckpt), out)
    assert (out / EXPORT_MARKER).is_file() and json.loads((out / EXPORT_MARKER).read_text())["dtype"] == "float32"
    (out / "model.safetensors").write_bytes(b"stale")
    export(str(ckpt), out, "bfloat16")  # its own folder: replaced
    assert (out / "model.safetensors").stat().st_size > 5
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.slow
def test_an_export_loads_anywhere_with_trust_remote_code_and_the_lm_eval_console_script(ckpt, tmp_path):
    """In a fresh process that never imports duality.hf, from another directory: AutoModelForCausalLM with
    trust_remote_code gives the checkpoint's logits; `lm_eval --model hf` scores the folder as eval.py scores the
    checkpoint; without the package, the error says what to install."""
    from duality.hf import export
    out = export(str(ckpt), tmp_path / "hf")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    probe = ("import json, sys, torch; from transformers import AutoModelForCausalLM; "
             "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True); "
             "print(json.dumps(m(torch.tensor([[5, 17, 3, 99]])).logits[0].tolist()))")
    r = subprocess.run([sys.executable, "-c", probe, str(out)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    gpt = eval_lib.load_model(str(ckpt))[0]
    with torch.no_grad():
        want = gpt(torch.tensor([[5, 17, 3, 99]]))[0][0]
    torch.testing.assert_close(torch.tensor(json.loads(r.stdout.strip().splitlines()[-1])), want, rtol=0, atol=1e-6)
    fake = tmp_path / "no_package" / "duality"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('not installed')\n")
    r = subprocess.run([sys.executable, "-c", probe, str(out)], cwd=tmp_path, capture_output=True, text=True,
                       env={**env, "PYTHONPATH": str(fake.parent), "HF_HOME": str(tmp_path / "hf_home2")}, timeout=300)
    assert r.returncode != 0 and "needs the duality package: `pip install -e .` in a checkout" in r.stderr
    lm_eval = Path(sys.executable).parent / "lm_eval"
    r = subprocess.run([str(lm_eval), "--model", "hf", "--model_args",
                        f"pretrained={out},trust_remote_code=True,max_length=256", "--tasks", "pydoc_mc",
                        "--include_path", LOCAL, "--limit", "16", "--device", "cpu", "--batch_size", "4",
                        "--output_path", str(tmp_path / "cli")], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    cli = json.loads(next((tmp_path / "cli").rglob("results_*.json")).read_text())["results"]["pydoc_mc"]
    own = eval_lib.run(compose([f"ckpt={ckpt}", "mode=lm_eval", f"lm_eval.include_path={LOCAL}", "device=cpu",
                                "lm_eval.tasks=[pydoc_mc]", "lm_eval.limit=16", "lm_eval.max_length=256"], "eval"))
    own = own["results"][str(ckpt)]["pydoc_mc"]
    assert cli["acc,none"] == own["acc,none"] and cli["acc_norm,none"] == own["acc_norm,none"]


def test_eval_reads_an_export_as_it_reads_the_run(ckpt, tmp_path):
    """ckpt=<export folder>: perplexity on the run's own data (from the export's marker) equal to the run's, a sample
    equal to the run's; an export written before the marker held the run's config still loads (its tokenizer from
    tokenizer.json, the same ids) and asks for data=."""
    out = tmp_path / "export"
    eval_lib.run(compose([f"ckpt={ckpt}", "mode=export", f"out={out}"], "eval"))
    run = eval_lib.run(compose([f"ckpt={ckpt}", "mode=perplexity", "eval_tokens=512", f"out={tmp_path}/a.json"],
                               "eval"))
    exp = eval_lib.run(compose([f"ckpt={out}", "mode=perplexity", "eval_tokens=512", f"out={tmp_path}/b.json"],
                               "eval"))
    assert exp["val_loss"] == pytest.approx(run["val_loss"], rel=1e-6) and exp["tokens"] == run["tokens"] == 512
    assert exp["step"] == run["step"] == 40 and exp["ckpt"] == str(out / "model.safetensors")
    gpt, tok, _ = eval_lib.load_model(str(out))
    gpt0, tok0, _ = eval_lib.load_model(str(ckpt))
    ids = torch.tensor([tok0.encode("The module provides")])
    assert tok.encode("The module provides") == ids[0].tolist()
    with torch.no_grad():
        torch.testing.assert_close(gpt(ids), gpt0(ids), rtol=0, atol=0)
    marker = out / "duality_export.json"
    marker.write_text(json.dumps({"checkpoint": str(ckpt), "dtype": "float32"}))  # as exports before the run's config
    with pytest.raises(ConfigError, match="holds no data config .*give the data, e.g. data=text"):
        eval_lib.run(compose([f"ckpt={out}", "mode=perplexity", "eval_tokens=512", f"out={tmp_path}/c.json"], "eval"))
    old = eval_lib.load_model(str(out))[1]
    assert old.encode("The module provides") == ids[0].tolist()


def test_bench_forward_seconds_counts_only_the_model_calls(monkeypatch):
    """benchmarks/bench_lm_eval.py's forwards-alone rate: the time inside each _forward of one pass (synchronised
    before and after), not the scorer's own work around them; the instance's method is restored."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_lm_eval
    clock = [0.0]
    monkeypatch.setattr(bench_lm_eval, "time", type("T", (), {"perf_counter": staticmethod(lambda: clock[0])}))

    class Scorer:
        def _forward(self, x):
            clock[0] += 2.0  # a forward
            return x

        def loglikelihood(self, reqs, disable_tqdm=False):
            clock[0] += 10.0  # the scorer's own work
            return [self._forward(r) for r in reqs]
    lm, syncs = Scorer(), []
    assert bench_lm_eval.forward_seconds(lm, [1, 2, 3], lambda: syncs.append(1)) == 6.0
    assert len(syncs) == 6 and "_forward" not in vars(lm) and lm._forward(5) == 5


def test_the_local_tasks_say_how_their_metrics_aggregate(monkeypatch, caplog):
    """The pydoc_* YAMLs (the template for a user's own tasks) give each metric its aggregation and direction
    (lm-eval's defaults, so the scores are the ones before): lm-eval warned twice per metric, 12 lines a run."""
    import logging

    from duality.evals.harness import load_tasks
    monkeypatch.chdir(ROOT)
    with caplog.at_level(logging.WARNING):
        tm = load_tasks(["pydoc_mc", "pydoc_ppl", "pydoc_complete"], LOCAL)
        tasks = tm.load(["pydoc_mc", "pydoc_ppl", "pydoc_complete"])
    said = [r.getMessage() for r in caplog.records if "is defined, but" in r.getMessage()]
    assert said == [], said
    assert len(tasks) == 3
