"""Context parallelism in the trunk: a model whose sequences are split over 2 or 4 gloo processes (GPT.forward with
cp_group) gives the whole sequence's loss and gradients, for each family with a form, on packed documents too; the
others are refused."""


import pytest
import torch
import torch.distributed as dist
from conftest import compose, spawn_ranks

from duality.model import ConfigError, build_model
from duality.model.pe import REGISTRY as SCHEMES

# (backbone with options, scheme, ranks): each family's context-parallel form, kernels/recurrences/cp.py (GLA,
# RetNet, linear attention, the delta rule, short convolutions) and kernels/attention/cp.py (softmax with RoPE, ALiBi
# and VO-RoPE, FoX's gate, sympow's gated power)
MODELS = [({"name": "gla"}, "rope", 2), ({"name": "retnet"}, "nope", 4), ({"name": "linear_attn"}, "sinusoidal", 4),
          ({"name": "transformer"}, "rope", 2), ({"name": "transformer"}, "alibi", 4),
          ({"name": "transformer"}, "vo_rope", 2), ({"name": "fox"}, "nope", 4),
          ({"name": "sympow", "gating": True}, "rope", 2),
          # short convolutions: each slice starts from the previous slice's last inputs
          ({"name": "gla", "short_conv": True}, "rope", 4), ({"name": "fox", "short_conv": True}, "rope", 2),
          ({"name": "deltanet"}, "nope", 2), ({"name": "gated_deltanet"}, "rope", 4),
          # accumulated rotations: the angle carried over from the slices before
          ({"name": "gla"}, "selective_rope", 4), ({"name": "transformer"}, "selective_rope", 2),
          ({"name": "gla"}, {"name": "selective_rope", "skip_conv": True, "bias": True, "phase_gate": True}, 2),
          ({"name": "fox"}, "learned_rotation", 2),
          # score biases: asked for against the gathered keys
          ({"name": "transformer"}, "t5", 2), ({"name": "transformer"}, "xl", 4),
          # the gated Oja rule: its value-side transition handed over
          ({"name": "gated_oja"}, "rope", 2)]
# packed documents: one row whose documents start at a slice's first token (12, with 4 slices of 12), cross a slice
# boundary (21..30 crosses 24) or span slices (30..48), one of a single token (20)
PACKED = [({"name": "gla"}, "rope", 4), ({"name": "gla", "short_conv": True}, "nope", 2),
          ({"name": "gla", "short_conv": True}, "rope", 4), ({"name": "gated_deltanet"}, "rope", 4),
          ({"name": "deltanet"}, "nope", 2), ({"name": "retnet"}, "sinusoidal", 2),
          ({"name": "transformer"}, "rope", 4), ({"name": "transformer"}, "alibi", 2),
          ({"name": "transformer"}, "learned", 4), ({"name": "fox"}, "nope", 4),
          # accumulated rotations: the angle since the first token's document began carried over
          ({"name": "gla"}, "selective_rope", 4),
          ({"name": "transformer"}, {"name": "selective_rope", "skip_conv": True, "bias": True, "phase_gate": True}, 4),
          ({"name": "fox"}, "learned_rotation", 2), ({"name": "gated_oja"}, "nope", 4)]
DOCUMENTS = torch.tensor([0, 7, 12, 20, 21, 30, 48])
SIZE = {"n_layer": 2, "d_model": 32, "n_heads": 2, "seq_len": 48}


def as_cfg(pe) -> dict:
    return pe if isinstance(pe, dict) else {"name": pe}


def built(backbone, pe):
    """The float64 model of a case, the same on every rank; parameters initialised to zero (T5's table, XL's u and
    v, biases) made random, so that no term of the scores vanishes."""
    from duality.model import build_model
    torch.manual_seed(0)
    model = build_model(backbone, as_cfg(pe), SIZE, 64).double()
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)
    return model


def model_rank_main(rank: int, world: int, backbone: dict, pe, packed: bool, out: str):
    from duality.kernels.varlen import slice_boundaries
    model = built(backbone, pe)
    idx = torch.randint(0, 64, (1 if packed else 2, 49), generator=torch.Generator().manual_seed(1))
    n = 48 // world
    part = slice(rank * n, (rank + 1) * n)
    cu = slice_boundaries(DOCUMENTS, rank * n, n) if packed else None
    _, loss = model(idx[:, :48][:, part], idx[:, 1:][:, part], cu_seqlens=cu, cp_group=dist.group.WORLD)
    loss.backward()
    torch.save({"loss": loss.detach(), "grads": {k: p.grad for k, p in model.named_parameters()}}, f"{out}.{rank}")


def case_id(x) -> str:
    return "-".join(f"{v}" for v in x.values()) if isinstance(x, dict) else str(x)


def split_equals_whole(tmp_path, backbone, pe, world: int, packed: bool):
    """Each rank's loss over its slice, averaged over ranks (equal slices), and each parameter's gradient, averaged
    as DDP would, equal the whole sequence's in one process (a float64 model whose loss the trunk takes in float32,
    hence 1e-5)."""
    spawn_ranks(model_rank_main, world, backbone, pe, packed, str(tmp_path / "m"))
    model = built(backbone, pe)
    idx = torch.randint(0, 64, (1 if packed else 2, 49), generator=torch.Generator().manual_seed(1))
    _, loss = model(idx[:, :48], idx[:, 1:], cu_seqlens=DOCUMENTS if packed else None)
    loss.backward()
    parts = [torch.load(tmp_path / f"m.{r}") for r in range(world)]
    torch.testing.assert_close(sum(p["loss"] for p in parts) / world, loss.detach(), rtol=1e-6, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(sum(q["grads"][name] for q in parts) / world, p.grad, rtol=1e-5, atol=1e-7,
                                   msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.slow
@pytest.mark.parametrize("backbone, pe, world", MODELS, ids=case_id)
def test_a_model_on_a_split_sequence_equals_the_whole(tmp_path, backbone, pe, world):
    split_equals_whole(tmp_path, backbone, pe, world, packed=False)


@pytest.mark.slow
@pytest.mark.parametrize("backbone, pe, world", PACKED, ids=case_id)
def test_a_model_on_split_packed_documents_equals_the_whole(tmp_path, backbone, pe, world):
    """Packed documents (train.doc_boundaries) split over ranks: the same loss and gradients as the whole row with
    its boundaries (each document kept to itself, positions from each document's start)."""
    split_equals_whole(tmp_path, backbone, pe, world, packed=True)


@pytest.mark.parametrize("pe", sorted(SCHEMES))
def test_score_bias_says_whether_a_scheme_scores_with_a_bias(pe):
    """Under context parallelism softmax attention asks a scheme with score_bias for its bias only once the keys
    are gathered (model/mixers/attention.py): the flag must be what scores() gives."""
    cfg = compose(["backbone=transformer", f"pe={pe}", "model.n_layer=1", "model.d_model=32", "model.n_heads=2",
                   "model.seq_len=16"])
    try:
        m = build_model(cfg.backbone, cfg.pe, cfg.model, 64)
    except ConfigError:
        pytest.skip(f"pe={pe} does not go with the transformer")
    scheme = m.blocks[0].mixer.pe
    if scheme is None:
        assert not SCHEMES[pe].score_bias
        return
    q, k = torch.randn(2, 8, 2, 16), torch.randn(2, 8, 2, 16)
    assert ("bias" in scheme.scores(q, k)) is scheme.score_bias, pe
    assert scheme.score_bias is (pe in ("t5", "xl"))


def test_a_model_without_a_context_parallel_form_is_refused():
    from duality.model import build_model
    for backbone, pe, options in (("path", "nope", {}), ("path_fox", "nope", {})):
        model = build_model({"name": backbone, **options}, {"name": pe}, SIZE, 64)
        with pytest.raises(ValueError, match="no context-parallel form yet for .*those with one: backbone=") as e:
            model.check_context_parallel()
        forms = str(e.value).split("those with one: ")[1]
        assert "gla, " in forms and "transformer" in forms and "t5" in forms and "path" not in forms
    for backbone, pe in (("gla", "rope"), ("transformer", "alibi"), ("gated_deltanet", "rope"), ("gated_oja", "nope")):
        build_model({"name": backbone}, {"name": pe}, SIZE, 64).check_context_parallel()
    # over packed documents: a layer the trunk runs one document at a time has no form yet
    for backbone, pe in (({"name": "sympow"}, "rope"), ({"name": "fox", "short_conv": True}, "nope"),
                         ({"name": "transformer"}, "vo_rope")):
        model = build_model(backbone, {"name": pe}, SIZE, 64)
        model.check_context_parallel()
        with pytest.raises(ValueError, match="over packed documents yet for .*those with one: backbone=") as e:
            model.check_context_parallel(packed=True)
        forms = str(e.value).split("those with one: ")[1]
        assert "gla, " in forms and "selective_rope" in forms
        assert not any(n in forms for n in ("sympow", "vo_rope", "t5", "xl,", "path"))
