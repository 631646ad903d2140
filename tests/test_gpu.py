"""GPU group (`pytest -m gpu` on a CUDA machine; CI deselects it): every FLA kernel path against its reference,
and a model of each backbone training through the kernels."""

import sys

import pytest
import torch

from conftest import ROOT

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
sys.path.insert(0, str(ROOT / "scripts"))


@pytest.mark.parametrize("T", [256, 200])
@pytest.mark.parametrize("name", ["gla", "simple_gla", "delta_rule", "gated_delta_rule", "oja", "fox", "alibi",
                                  "sympow2", "sympow2_gated", "sympow4_gated", "path", "path_fox"])
def test_kernel_matches_reference(name, T):
    from kernel_check import check
    err = check(name, B=2, T=T, H=4, D=64)
    assert all(e < 2e-2 for e in err.values()), err


@pytest.mark.parametrize("backbone", ["transformer", "linear_attn", "gla", "deltanet", "gated_deltanet", "retnet",
                                      "mamba2", "fox", "sympow", "path", "path_fox", "gated_oja"])
def test_backbone_trains_on_gpu(backbone):
    from model import build_model
    torch.manual_seed(0)
    pe = "nope" if backbone.startswith("path") else "rope"
    m = build_model({"name": backbone}, {"name": pe}, {"name": "t", "n_layer": 2, "d_model": 256, "n_heads": 4,
                                                       "seq_len": 256}, 512).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    x = torch.randint(0, 512, (4, 257), device="cuda")
    losses = []
    for _ in range(30):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(x[:, :-1], x[:, 1:])[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("backbone,pe", [("transformer", "rope"), ("transformer", "alibi"), ("fox", "rope"),
                                         ("gla", "rope"), ("retnet", "nope"), ("mamba2", "nope"),
                                         ("deltanet", "nope"), ("gated_deltanet", "rope"), ("linear_attn", "rope")])
def test_packed_documents_through_the_kernels(backbone, pe):
    """The CUDA kernels' packed (cu_seqlens) paths == each document run alone, forward and parameter gradients
    (fp32; document lengths that no kernel block divides)."""
    from model import build_model
    torch.manual_seed(0)
    m = build_model({"name": backbone}, {"name": pe}, {"name": "t", "n_layer": 2, "d_model": 256, "n_heads": 4,
                                                       "seq_len": 512}, 512).cuda()
    assert m.blocks[0].mixer.packed
    cu = torch.tensor([0, 77, 78, 300, 555], device="cuda")
    x = torch.randint(0, 512, (1, 555), device="cuda")
    packed = m(x, cu_seqlens=cu)[0]
    gp = torch.autograd.grad(packed.square().mean(), list(m.parameters()), allow_unused=True)
    alone = torch.cat([m(x[:, s:e])[0] for s, e in zip(cu[:-1].tolist(), cu[1:].tolist())], 1)
    ga = torch.autograd.grad(alone.square().mean(), list(m.parameters()), allow_unused=True)
    torch.testing.assert_close(packed, alone, rtol=1e-2, atol=1e-2)  # FLA multiplies fp32 in tf32
    for a, b in zip(gp, ga):
        if a is not None:
            torch.testing.assert_close(a, b, rtol=5e-2, atol=1e-3)


@pytest.mark.parametrize("packed", [False, True])
def test_short_conv_kernel_matches_reference(packed):
    """ShortConv on CUDA (FLA's causal_conv1d) == its reference on the CPU (float32), output and both gradients, with
    and without document boundaries."""
    from model.mixers.layers import ShortConv
    torch.manual_seed(0)
    conv = ShortConv(96)
    x = torch.randn(1 if packed else 3, 77, 96, requires_grad=True)
    cu = torch.tensor([0, 5, 40, 77], dtype=torch.int32) if packed else None
    g = torch.randn(x.shape[0], 77, 96)
    outs = []
    for dev in ("cpu", "cuda"):
        c = ShortConv(96).to(dev)
        c.load_state_dict(conv.state_dict())
        xd = x.detach().to(dev).requires_grad_()
        y = c(xd, cu_seqlens=None if cu is None else cu.to(dev))
        (y * g.to(dev)).sum().backward()
        outs.append([t.detach().cpu() for t in (y, xd.grad, c.weight.grad)])
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pe", ["selective_rope", "rope"])
def test_compiled_rotation_matches_eager(pe):
    """Selective RoPE: torch.compile of a model whose rotation runs the Triton kernel (called between Dynamo's
    graphs: tracing into it failed under Triton 3.7.1). RoPE: eager it runs the Triton kernel, compiled the cos/sin
    table that Inductor fuses. Either way, loss and gradients equal the eager model's."""
    from model import build_model
    torch.manual_seed(0)
    m = build_model({"name": "transformer"}, {"name": pe}, {"name": "t", "n_layer": 2, "d_model": 256,
                                                           "n_heads": 4, "seq_len": 256}, 512).cuda()
    x = torch.randint(0, 512, (2, 257), device="cuda")
    out = []
    for model in (m, torch.compile(m)):
        loss = model(x[:, :-1], x[:, 1:])[1]
        out.append([loss, *torch.autograd.grad(loss, list(m.parameters()), allow_unused=True)])
    for a, b in zip(*out):
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-4)
