"""Decoding (model/decode.py) on the CPU, every backbone x scheme the repo accepts: the fixed-buffer step equals the
parallel forward (float64), the repo's generate loop gives transformers' generic generate's tokens, every dtype
keeps its dtype through every form, and the refusals. tests/test_gpu.py runs the same matrix on a GPU with CUDA
graphs and bf16 weights."""

import pytest
import torch

from duality.model import build_model, valid_schemes
from duality.model.decode import Decoder, generate, refusal, sample
from duality.model.mixers import REGISTRY as MIXERS

TINY = {"n_layer": 2, "d_model": 32, "n_heads": 2, "seq_len": 64}
PAIRS = [(b, p) for b in sorted(MIXERS) if b != "base_conv" for p in valid_schemes(b)]  # the 72 accepted pairs
# option variants with state of their own: recurrent sympow, gates, short convolutions, a hybrid stack
VARIANTS = [({"name": "sympow", "recurrent": True, "gating": True}, "learned_rotation"),
            ({"name": "sympow", "power": 4, "gating": True}, "rope"),
            ({"name": "fox", "short_conv": True, "output_gate": True, "qk_norm": True}, "rope"),
            ({"name": "gla", "short_conv": True}, "selective_rope"),
            ({"name": "deltanet", "allow_neg_eigval": True}, "nope"),
            ({"name": "gated_deltanet"}, "nope", {"layer_mixers": ["base_conv", "backbone"]})]


def _model(backbone, pe, vocab=97, **size):
    torch.manual_seed(0)
    backbone = backbone if isinstance(backbone, dict) else {"name": backbone}
    return build_model(backbone, {"name": pe}, {**TINY, **size}, vocab).eval()


def _steps(model, idx, P, fixed):
    """Logits at positions P-1 .. T-2: the prompt idx[:, :P] prefilled, then idx's next tokens one step each."""
    d = Decoder(model, idx.shape[1], fixed=fixed)
    with torch.no_grad():
        out = [d.prefill(idx[:, :P])] + [d.step(idx[:, t:t + 1]).clone() for t in range(P, idx.shape[1] - 1)]
    return torch.stack(out, 1)


@pytest.mark.parametrize("case", PAIRS + VARIANTS, ids=lambda c: f"{c[0] if isinstance(c[0], str) else c[0]}-{c[1]}")
def test_fixed_buffer_decoding_equals_the_parallel_forward(case):
    """Prefill 11 tokens, then 8 single-token steps into fixed buffers (the position a tensor, KV caches padded,
    state written back in place: what a CUDA graph replays) give the parallel forward's logits, float64 to 1e-10;
    T5 and Transformer-XL decode with a growing cache through the same loop."""
    backbone, pe, *size = case
    m = _model(backbone, pe, **(size[0] if size else {})).double()
    idx = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        full = m(idx)[0][:, 10:19]
    fixed = refusal(m) is None
    assert fixed == (pe not in ("t5", "xl"))
    torch.testing.assert_close(_steps(m, idx, 11, fixed), full, rtol=0, atol=1e-10)


@pytest.mark.parametrize("backbone,pe", [("transformer", "alibi"), ("fox", "rope"), ("gla", "selective_rope"),
                                         ("gated_deltanet", "rope"), ("path_fox", "nope"), ("transformer", "t5"),
                                         ("sympow", "learned_rotation"), ("mamba2", "sinusoidal")])
def test_a_prompt_prefilled_in_chunks_equals_one_forward(backbone, pe, monkeypatch):
    """Prefill in chunks (decode.PREFILL_TOKENS over the batch; here 2 x 7 tokens) continues each chunk from the
    state the one before left: the logits of the steps after it are the parallel forward's (float64, 1e-10)."""
    from duality.model import decode
    monkeypatch.setattr(decode, "PREFILL_TOKENS", 14)
    m = _model(backbone, pe).double()
    idx = torch.randint(0, 97, (2, 24))
    with torch.no_grad():
        full = m(idx)[0][:, 16:23]
    torch.testing.assert_close(_steps(m, idx, 17, refusal(m) is None), full, rtol=0, atol=1e-10)


@pytest.mark.parametrize("backbone,pe", PAIRS)
def test_generate_gives_transformers_generic_tokens(backbone, pe):
    """The repo's loop (DualityForCausalLM.generate's default) against transformers' own generate loop
    (fast_decoding=False) on fp32 weights: greedy token for token, with an end-of-sequence id that some rows emit
    (padding after it, and the output cut where every row has ended, as transformers does)."""
    from duality.hf import DualityConfig, DualityForCausalLM
    torch.manual_seed(0)
    config = DualityConfig(backbone={"name": backbone}, pe={"name": pe}, model=dict(TINY), vocab_size=97,
                           eos_token_id=96, pad_token_id=96, bos_token_id=96)
    m = DualityForCausalLM(config).eval()
    prompt = torch.randint(0, 96, (3, 7))
    kw = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False)
    ours, theirs = m.generate(prompt, **kw), m.generate(prompt, fast_decoding=False, **kw)
    assert torch.equal(ours, theirs)
    # an end-of-sequence id the model does emit: the second greedy token of row 0
    eos = int(theirs[0, 8])
    kw.update(eos_token_id=eos, pad_token_id=0)
    ours, theirs = m.generate(prompt, **kw), m.generate(prompt, fast_decoding=False, **kw)
    assert torch.equal(ours, theirs) and (ours[0, 9:] == 0).all()


def test_sampling_and_stopping_criteria_follow_transformers():
    """Sampling with temperature, top-k and top-p draws what transformers' warpers and multinomial draw from the same
    seed; a stopping criterion ends rows as in transformers' loop."""
    from transformers import StoppingCriteria

    from duality.hf import DualityConfig, DualityForCausalLM
    torch.manual_seed(0)
    config = DualityConfig(backbone={"name": "gla"}, pe={"name": "rope"}, model=dict(TINY), vocab_size=97,
                           eos_token_id=96, pad_token_id=96, bos_token_id=96)
    m = DualityForCausalLM(config).eval()
    prompt = torch.randint(0, 96, (4, 5))
    for kw in (dict(temperature=0.7, top_k=20, top_p=0.9), dict(temperature=1.3, top_p=0.5), dict(top_k=3)):
        out = []
        for fast in (True, False):
            torch.manual_seed(11)
            out.append(m.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10, do_sample=True,
                                  fast_decoding=fast, **kw))
        assert torch.equal(*out), kw

    class RowsWithEven(StoppingCriteria):  # a row ends once it has produced an even token
        def __call__(self, input_ids, scores, **kwargs):
            return (input_ids[:, 5:] % 2 == 0).any(-1)

    out = [m.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10, do_sample=False,
                      stopping_criteria=[RowsWithEven()], fast_decoding=fast) for fast in (True, False)]
    assert torch.equal(*out) and out[0].shape[1] < 15


def test_top_p_and_top_k_equal_transformers_warpers():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
    logits = torch.randn(6, 50) * 3
    for t, k, p in ((0.7, 10, 0.8), (1.0, None, 0.3), (2.0, 5, None)):
        want = TemperatureLogitsWarper(t)(None, logits.clone())
        want = TopKLogitsWarper(k)(None, want) if k else want
        want = TopPLogitsWarper(p)(None, want) if p else want
        g = [torch.Generator().manual_seed(3) for _ in range(2)]
        draws = sample(logits, t, k, p, generator=g[0])
        assert torch.equal(draws, torch.multinomial(want.softmax(-1), 1, generator=g[1])), (t, k, p)
        # the allowed set itself: a token never drawn where transformers' warpers removed it
        allowed = torch.isfinite(want)
        many = torch.stack([sample(logits, t, k, p) for _ in range(50)])
        assert allowed.gather(1, many[..., 0].T).all()
    assert torch.equal(sample(logits), logits.argmax(-1, keepdim=True))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backbone,pe", [("gla", "rope"), ("gated_deltanet", "nope"), ("retnet", "selective_rope"),
                                         ("mamba2", "nope"), ("deltanet", "rope"), ("gated_oja", "nope"),
                                         ("linear_attn", "rope"), ("path_fox", "nope"), ("fox", "rope"),
                                         ("transformer", "alibi"), ("sympow", "rope")])
def test_half_precision_weights_keep_their_dtype_in_every_form(backbone, pe, dtype):
    """Weights cast to bf16 / fp16 (what from_pretrained(dtype=...) and lm-eval's dtype= do): the parallel forward,
    the prefill and every fixed-buffer step return logits of that dtype, and each gated output stage receives its
    output projection's dtype. The decoding steps of the recurrences accumulate in fp32; they hand back v's dtype as
    FLA's kernels do (an fp32 output met a bf16 projection on a GPU: issue #73's 44 crashes)."""
    m = _model(backbone, pe).to(dtype)
    seen = []
    for mod in m.modules():
        if type(mod).__name__ == "GatedOutput":
            mod.register_forward_pre_hook(lambda mod, args: seen.append(args[0].dtype))
    idx = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        full = m(idx)[0]
        d = Decoder(m, 16)
        steps = [d.prefill(idx[:, :10])] + [d.step(idx[:, t:t + 1]) for t in range(10, 15)]
    assert full.dtype == dtype and all(s.dtype == dtype for s in steps)
    assert all(s == dtype for s in seen)
    got = torch.stack([s.float() for s in steps], 1)
    ref = full[:, 9:15].float()
    assert ((got - ref).norm() / ref.norm()).item() < 3e-2  # the same logits to half-precision rounding


def test_bf16_weights_save_load_in_bf16_and_generate(tmp_path):
    """A model saved in bf16 (as eval.py mode=export dtype=bfloat16 writes it, tests/test_eval.py) records its dtype
    in config.json; from_pretrained loads it in bf16 (dtype="auto") and it generates through the repo's loop the
    tokens transformers' loop gives."""
    import json

    from transformers import AutoModelForCausalLM

    from duality.hf import DualityConfig, DualityForCausalLM
    torch.manual_seed(0)
    config = DualityConfig(backbone={"name": "gated_deltanet"}, pe={"name": "rope"}, model=dict(TINY), vocab_size=97,
                           eos_token_id=96, pad_token_id=96, bos_token_id=96)
    DualityForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text()).get("dtype") == "bfloat16"
    m = AutoModelForCausalLM.from_pretrained(tmp_path, dtype="auto").eval()
    assert m.dtype == torch.bfloat16
    prompt = torch.randint(0, 96, (2, 5))
    kw = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False)
    assert torch.equal(m.generate(prompt, **kw), m.generate(prompt, fast_decoding=False, **kw))


def test_refusals_name_the_way_out():
    m = _model("transformer", "t5")
    with pytest.raises(ValueError, match="pe=t5's bias"):
        Decoder(m, 32, fixed=True)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        Decoder(_model("gla", "rope"), 32, graphs=True)
    learned = _model("transformer", "learned")  # 64 positions
    with pytest.raises(ValueError, match="pe=learned has 64 positions"):
        generate(learned, torch.zeros(1, 60, dtype=torch.long), 10)
    with pytest.raises(ValueError, match="max_new_tokens=-1"):
        generate(learned, torch.zeros(1, 6, dtype=torch.long), -1)
    assert generate(learned, torch.zeros(1, 60, dtype=torch.long), 4).shape == (1, 64)


@pytest.mark.slow
@pytest.mark.parametrize("backbone,pe", [("gla", "nope"), ("transformer", "rope"), ("gated_deltanet", "nope")])
def test_a_compiled_step_gives_the_eager_steps_tokens(backbone, pe):
    """generate(compile=True): the decoding step through torch.compile (inductor's fused kernels) gives the eager
    step's logits and greedy tokens (fp32, CPU)."""
    model = _model(backbone, pe)
    idx = torch.randint(0, 97, (2, 21))
    eager, compiled = _steps(model, idx, 9, fixed=True), None
    d = Decoder(model, idx.shape[1], fixed=True, compile=True)
    with torch.no_grad():
        compiled = torch.stack([d.prefill(idx[:, :9])] + [d.step(idx[:, t:t + 1]).clone() for t in range(9, 20)], 1)
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)
    assert torch.equal(generate(model, idx[:, :9], 8, compile=True), generate(model, idx[:, :9], 8))
