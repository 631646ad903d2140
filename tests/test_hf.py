"""The transformers face (hf.py): every backbone x scheme saves and loads through AutoModelForCausalLM with the same
logits; transformers' generate equals the trunk's own GPT.generate; names of this repo shadow no other package."""

import json
import subprocess
import sys

import pytest
import torch

from duality.data.tokenizer import Tokenizer
from duality.hf import DualityConfig, DualityForCausalLM, hf_tokenizer
from duality.model import valid_schemes
from duality.model.mixers import REGISTRY as MIXERS
from conftest import ROOT

V, EOT = 61, 60
COMBOS = [(b, p) for b in sorted(MIXERS) for p in valid_schemes(b)]
SIZE = {"n_layer": 2, "d_model": 32, "n_heads": 2, "seq_len": 32}


def make(backbone, pe, seed=0, **model):
    torch.manual_seed(seed)
    config = DualityConfig(backbone={"name": backbone}, pe={"name": pe}, model={**SIZE, **model}, vocab_size=V,
                           eos_token_id=EOT, pad_token_id=EOT, bos_token_id=EOT)
    m = DualityForCausalLM(config).double()
    with torch.no_grad():  # zero-initialised parameters (T5's table, XL's u, v) would hide their code paths
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m.eval()


@pytest.mark.parametrize("backbone,pe", COMBOS)
def test_save_and_load_through_the_auto_classes_gives_the_same_logits(backbone, pe, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM
    m = make(backbone, pe)
    m.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "duality"
    assert AutoConfig.from_pretrained(tmp_path).backbone["name"] == backbone
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert type(loaded) is DualityForCausalLM
    idx = torch.randint(0, V, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx).logits, m(idx).logits, rtol=0, atol=0)
        torch.testing.assert_close(loaded(idx).logits, m.model(idx)[0], rtol=0, atol=0)  # the trunk itself
    # the buffers that are computed, not saved (RoPE's cos/sin, ALiBi's slopes, ...), are the constructor's again
    for (name, a), (_, b) in zip(m.model.named_buffers(), loaded.model.named_buffers()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, check_dtype=False, msg=name)


def test_tied_embeddings_are_saved_once_and_tied_after_loading(tmp_path):
    from transformers import AutoModelForCausalLM
    m = make("transformer", "rope", tie_embeddings=True)
    m.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    assert loaded.model.lm_head.weight is loaded.model.wte.weight
    torch.testing.assert_close(loaded.model.wte.weight, m.model.wte.weight, rtol=0, atol=0)


def upto_eot(row: list[int]) -> list[int]:
    """transformers stops a row at end-of-text and pads it; the trunk's own generate decodes on."""
    return row[:row.index(EOT) + 1] if EOT in row else row


@pytest.mark.parametrize("backbone", sorted(MIXERS))
def test_generate_equals_the_trunks_own_generate(backbone):
    """Greedy and sampled decoding through DualityCache (each mixer's KV cache / recurrent state) give the tokens of
    GPT.generate, which tests/test_model.py checks against full forwards."""
    m = make(backbone, valid_schemes(backbone)[0])
    prompt = torch.randint(0, EOT, (3, 7))
    ones = torch.ones_like(prompt)
    ours = m.model.generate(prompt, 12, temperature=0)
    theirs = m.generate(prompt, attention_mask=ones, max_new_tokens=12, do_sample=False)
    assert [upto_eot(r) for r in theirs.tolist()] == [upto_eot(r) for r in ours.tolist()]
    torch.manual_seed(5)
    ours = m.model.generate(prompt, 12, temperature=0.8, top_k=7)
    torch.manual_seed(5)
    theirs = m.generate(prompt, attention_mask=ones, max_new_tokens=12, do_sample=True, temperature=0.8, top_k=7,
                        top_p=1.0)
    assert [upto_eot(r) for r in theirs.tolist()] == [upto_eot(r) for r in ours.tolist()]


@pytest.mark.parametrize("backbone", ["transformer", "gla", "mamba2"])
def test_beam_search_reorders_the_cache(backbone):
    """Beam search reorders the cache's rows each step (DualityCache.reorder_cache); without a cache every step is a
    full forward of the whole prefix, which needs no reordering: the two agree."""
    m = make(backbone, valid_schemes(backbone)[0])
    prompt = torch.randint(0, EOT, (2, 6))
    kw = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=8, num_beams=3, do_sample=False)
    assert torch.equal(m.generate(prompt, use_cache=True, **kw), m.generate(prompt, use_cache=False, **kw))


def test_left_padded_prompts_generate_as_each_prompt_alone():
    """Prompts of several lengths, left-padded as tokenizers pad for decoder-only models: each row's new tokens are
    those of its prompt generated alone; stopping criteria see the padded batch (lm-eval's track its rows)."""
    from transformers import StoppingCriteria
    m = make("gla", "rope")
    prompts = [torch.randint(0, EOT, (n,)) for n in (5, 3, 5, 1)]
    W = 5
    ids = torch.stack([torch.cat([torch.full((W - len(p),), EOT), p]) for p in prompts])
    mask = torch.stack([torch.cat([torch.zeros(W - len(p)), torch.ones(len(p))]).long() for p in prompts])

    class AfterFour(StoppingCriteria):  # done when every row of the padded batch has 4 new tokens
        def __call__(self, input_ids, scores, **kwargs):
            assert input_ids.shape[0] == len(prompts) and input_ids.shape[1] >= W
            return input_ids.shape[1] >= W + 4

    out = m.generate(ids, attention_mask=mask, max_length=W + 10, do_sample=False, stopping_criteria=[AfterFour()])
    assert out.shape[0] == 4 and torch.equal(out[:, :W], ids)
    for row, p in zip(out, prompts):
        alone = m.generate(p[None], attention_mask=torch.ones(1, len(p), dtype=torch.long), max_new_tokens=4,
                           do_sample=False)[0, len(p):]
        assert upto_eot(row[W:W + 4].tolist()) == upto_eot(alone.tolist())
    with pytest.raises(ValueError, match="left padding only"):
        m.generate(ids, attention_mask=mask.flip(-1), max_new_tokens=2)  # right padding
    with pytest.raises(ValueError, match="only right padding"):
        m(ids, attention_mask=mask)


def test_right_padding_leaves_each_rows_logits_unchanged():
    m = make("gated_deltanet", "nope")
    idx = torch.randint(0, EOT, (2, 10))
    mask = torch.ones_like(idx)
    mask[1, 6:] = 0
    with torch.no_grad():
        full = m(idx, attention_mask=mask).logits
        alone = m(idx[1:, :6]).logits
    torch.testing.assert_close(full[1, :6], alone[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backbone,pe,tie", [("transformer", "xl", False), ("gla", "selective_rope", True)])
def test_hidden_states_and_logits_at_give_the_forwards_logits_at_any_positions(backbone, pe, tie):
    """hidden_states then logits_at on some (row, position) pairs (what the batched lm-eval scorer runs) equal the
    forward's logits there, tied embeddings or not; a compress head has no per-token hidden state."""
    m = make(backbone, pe, tie_embeddings=tie)
    idx = torch.randint(0, EOT, (3, 11))
    rows, pos = torch.tensor([0, 2, 2, 1]), torch.tensor([10, 0, 7, 3])
    with torch.no_grad():
        want = m(idx).logits[rows, pos]
    h = m.hidden_states(idx)
    assert h.shape == (3, 11, SIZE["d_model"]) and not h.requires_grad
    torch.testing.assert_close(m.logits_at(h[rows, pos]), want, rtol=1e-12, atol=1e-12)
    compress = make("gla", "nope", head="compress")
    with pytest.raises(ValueError, match="head=compress decodes a whole sequence"):
        compress.hidden_states(idx)


def test_labels_give_the_shifted_next_token_loss():
    m = make("transformer", "alibi")
    idx = torch.randint(0, EOT, (2, 12))
    labels = idx.clone()
    labels[0, :4] = -100
    out = m(idx, labels=labels)
    _, expect = m.model(idx[:, :-1], torch.where(labels[:, 1:] == -100, -1, labels[:, 1:]))
    torch.testing.assert_close(out.loss, expect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["byte", "symbols", "bpe"])
def test_tokenizer_export_keeps_ids_and_text(kind, tmp_path):
    """AutoTokenizer on the exported files encodes and decodes as the repo's tokenizer (data/tokenizer.py) does."""
    from transformers import AutoTokenizer

    from duality.data.tokenizer import train_bpe
    text = "def f(x):\n    return x ** 2  # ünïcode ✓"
    tok = {"byte": lambda: Tokenizer("byte"),
           "symbols": lambda: Tokenizer("symbols", json.dumps(["<pad>", "a", "b", "c", "<eos>"])),
           "bpe": lambda: train_bpe([text * 3, "return the value of x"] * 20, 300)}[kind]()
    if kind == "symbols":
        text = "a b c  a <eos> b"
    hf_tokenizer(tok).save_pretrained(tmp_path)
    auto = AutoTokenizer.from_pretrained(tmp_path)
    assert auto(text, add_special_tokens=False)["input_ids"] == tok.encode(text)
    assert auto.eos_token_id == tok.eot_id == auto.pad_token_id and auto.padding_side == "left"
    ids = tok.encode(text)
    assert auto.decode(ids) == tok.decode(ids)
    if kind == "bpe":  # an exported folder is a tokenizer for training too (data.tokenizer=<folder>)
        from duality.data.tokenizer import load_pretrained
        assert load_pretrained(str(tmp_path)).encode(text) == tok.encode(text)


def test_no_top_level_name_of_this_repo_is_importable_and_transformers_kernel_lookup_is_unaffected(tmp_path):
    """Installed, the repo is one package, `duality`: its folders (kernels, model, data, ...) are not top-level
    names, so Hugging Face's `kernels` (which transformers looks up) cannot be shadowed, from any directory; a script
    at the repository root (python train.py) drops the root from sys.path on `import duality`."""
    names = ["kernels", "model", "data", "evals", "trainer", "common", "train", "eval", "hf"]
    probe = ("import importlib.util, json, sys, duality\n"
             "from transformers.utils.import_utils import is_kernels_available\n"
             f"found = {{n: importlib.util.find_spec(n) is not None for n in {names}}}\n"
             "print(json.dumps({'found': found, 'kernels_available': is_kernels_available(),\n"
             "                  'repo_kernels_imported': 'kernels' in sys.modules}))\n")
    for cwd in (tmp_path, ROOT):
        r = subprocess.run([sys.executable, "-c", probe], cwd=cwd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert not any(got["found"].values()), (cwd, got)
        assert got["kernels_available"] is False and got["repo_kernels_imported"] is False, (cwd, got)
    # the check can fail: without the package's sys.path rule, the root's folders are top-level names there
    r = subprocess.run([sys.executable, "-c", "import importlib.util; print(importlib.util.find_spec('kernels'))"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert str(ROOT / "kernels") in r.stdout
