"""Fused linear + cross-entropy (kernels/linear_ce/) against the plain formula, and the GPT's loss through it. The
Triton kernel runs in Triton's interpreter on a CPU (conftest sets TRITON_INTERPRET=1 without a GPU)."""

import os

import pytest
import torch
import torch.nn.functional as F
from conftest import interp

import duality.kernels.linear_ce.chunked as lce
import duality.kernels.linear_ce.kernel as lck
from duality.kernels.linear_ce import linear_cross_entropy, linear_cross_entropy_reference
from duality.model import build_model


def _inputs(n=77, d=24, v=101, dtype=torch.float64, ignored=(3, 40, 76)):
    g = torch.Generator().manual_seed(n * v)
    h = torch.randn(n, d, generator=g, dtype=dtype, requires_grad=True)
    w = torch.randn(v, d, generator=g, dtype=dtype, requires_grad=True)
    y = torch.randint(0, v, (n,), generator=g)
    y[list(ignored)] = -1
    return h, w, y


@pytest.mark.parametrize("chunk_elements", [101 * 256, 10 ** 9])  # 256-token chunks (77 % 256: one ragged), one chunk
def test_chunked_equals_reference_loss_and_gradients(monkeypatch, chunk_elements):
    monkeypatch.setattr(lce, "CHUNK_ELEMENTS", chunk_elements)
    h, w, y = _inputs(n=600)
    loss = linear_cross_entropy(h, w, y)
    (3.0 * loss).backward()  # a non-unit incoming gradient reaches both stored gradients
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref = linear_cross_entropy_reference(h, w, y)
    (3.0 * ref).backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)
    torch.testing.assert_close(gh, h.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gw, w.grad, rtol=1e-10, atol=1e-12)
    assert gh[[3, 40, 76]].abs().max() == 0  # ignored tokens get no gradient


def test_chunk_size_and_no_grad_path():
    assert lce._chunks(32768, 50304) == 10496 and lce._chunks(100, 50304) == 100
    h, w, y = _inputs()
    with torch.no_grad():
        assert linear_cross_entropy(h, w, y).item() == pytest.approx(linear_cross_entropy_reference(h, w, y).item(),
                                                                      rel=1e-12)
    y[:] = -1  # nothing to score: 0, not the reference's 0/0
    assert linear_cross_entropy(h, w, y).item() == 0.0


def test_autocast_matches_a_plain_linear_in_the_same_dtype():
    h, w, y = _inputs(dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(h, w, y)
        loss.backward()
        gh, gw = h.grad.clone(), w.grad.clone()
        h.grad = w.grad = None
        ref = F.cross_entropy(F.linear(h, w).float(), y, ignore_index=-1)
        ref.backward()
    assert loss.dtype == torch.float32 and h.grad.dtype == gh.dtype == torch.float32
    assert loss.item() == pytest.approx(ref.item(), rel=1e-3)
    torch.testing.assert_close(gh, h.grad, rtol=2e-2, atol=2e-4)
    torch.testing.assert_close(gw, w.grad, rtol=2e-2, atol=2e-4)


@pytest.mark.parametrize("impl", ["auto", pytest.param("triton", marks=pytest.mark.skipif(  # a CPU model: the
    os.environ.get("TRITON_INTERPRET") != "1", reason="runs the kernel in the interpreter"))])    # interpreter only
def test_model_loss_and_gradients_equal_the_plain_logits_path(monkeypatch, impl):
    """What training optimises (the fused loss) is the cross-entropy of the logits the model returns."""
    monkeypatch.setattr(lce, "CHUNK_ELEMENTS", 512 * 64)  # several chunks of 64 tokens
    m = build_model({"name": "transformer"}, {"name": "rope"},
                    {"n_layer": 2, "d_model": 32, "n_heads": 2, "seq_len": 64, "tie_embeddings": True,
                     "fused_loss": True, "fused_loss_impl": impl}, 512).double()
    idx = torch.randint(0, 512, (3, 50))
    tgt = idx.roll(-1, 1)
    tgt[:, -1] = -1
    none, loss = m(idx, tgt)
    assert none is None
    loss.backward()
    fused = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    logits, _ = m(idx)
    plain = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=-1)
    plain.backward()
    assert loss.item() == pytest.approx(plain.item(), rel=1e-12)
    for n, p in m.named_parameters():
        torch.testing.assert_close(fused[n], p.grad, rtol=1e-9, atol=1e-12, msg=n)


def test_sparse_loss_scores_only_the_targets_with_the_same_loss_and_gradients(monkeypatch):
    """model.sparse_loss (MQAR: a target at 1 position in 16): the loss and every gradient as with all positions,
    with only the scored rows reaching the head."""
    import duality.model.gpt as gpt
    cfg = {"n_layer": 2, "d_model": 32, "n_heads": 2, "seq_len": 64, "tie_embeddings": True, "fused_loss": True}
    dense = build_model({"name": "gla"}, {"name": "nope"}, cfg, 300).double()
    sparse = build_model({"name": "gla"}, {"name": "nope"}, {**cfg, "sparse_loss": True}, 300).double()
    sparse.load_state_dict(dense.state_dict())
    rows = []
    real = gpt.linear_cross_entropy
    monkeypatch.setattr(gpt, "linear_cross_entropy", lambda h, *a: rows.append(h.shape[0]) or real(h, *a))
    idx = torch.randint(0, 300, (3, 48))
    tgt = torch.full_like(idx, -1)
    tgt[:, 7::16] = idx[:, 8::16]  # 3 scored positions a row
    grads = []
    for m in (dense, sparse):
        _, loss = m(idx, tgt)
        loss.backward()
        grads.append((loss.item(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    assert rows == [3 * 48, 9]
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-12)
    for n, g in grads[0][1].items():
        torch.testing.assert_close(grads[1][1][n], g, rtol=1e-9, atol=1e-12, msg=n)
    sparse.zero_grad()
    _, loss = sparse(idx, torch.full_like(idx, -1))  # nothing scored: loss 0, zero gradients, no error
    loss.backward()
    assert loss.item() == 0.0 and all(p.grad is None or p.grad.abs().max() == 0 for p in sparse.parameters())


def test_shape_errors():
    h, w, y = _inputs()
    with pytest.raises(ValueError, match=r"h \[N, d\], weight \[V, d\], targets \[N\]"):
        linear_cross_entropy(h, w[:, :5], y)
    with pytest.raises(ValueError, match=r"impl must be one of \['auto', 'triton', 'chunked', 'torch'\]"):
        linear_cross_entropy(h, w, y, impl="fused")


@interp
@pytest.mark.parametrize("block", [32, 4096])  # 101 columns in 4 blocks (the last ragged), or in one
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kernel_equals_reference_loss_and_gradients(monkeypatch, block, dtype):
    monkeypatch.setattr(lce, "CHUNK_ELEMENTS", 101 * 256)  # 600 tokens in 3 chunks, the last ragged
    monkeypatch.setattr(lck, "BLOCK_V", block)
    h, w, y = _inputs(n=600, dtype=dtype)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    h, w, y = (t.detach().to(dev).requires_grad_(t.requires_grad) for t in (h, w, y))
    loss = linear_cross_entropy(h, w, y, impl="triton")
    (3.0 * loss).backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref = linear_cross_entropy_reference(h, w, y)
    (3.0 * ref).backward()
    tol = {"rtol": 1e-11, "atol": 1e-13} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(loss, ref, **tol)
    torch.testing.assert_close(gh, h.grad, **tol)
    torch.testing.assert_close(gw, w.grad, **tol)
    assert gh[[3, 40, 76]].abs().max() == 0


@interp
def test_kernel_rows_extreme_logits_bf16_and_nothing_scored():
    """Logits of +-1e4 (a softmax that saturates), bf16 logits overwritten by their gradient in bf16, no target."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    z = torch.randn(5, 70, dtype=torch.float64, device=dev) * 3
    z[0, 7], z[1, :] = 1e4, -1e4
    y = torch.tensor([7, 3, -1, 69, 0], device=dev)
    scale = torch.tensor([0.25], dtype=torch.float64, device=dev)
    ref_rows = F.cross_entropy(z, y, ignore_index=-1, reduction="none")
    ref_grad = (torch.softmax(z, -1) - F.one_hot(y.clamp(min=0), 70)) * 0.25 * (y != -1)[:, None]
    g = z.clone()
    rows = lck.ce_rows(g, y, scale)
    torch.testing.assert_close(rows, ref_rows, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, ref_grad, rtol=1e-12, atol=1e-15)
    zb = z.to(torch.bfloat16)
    rows = lck.ce_rows(zb, y, scale.float())
    assert rows.dtype == torch.float32 and zb.dtype == torch.bfloat16
    torch.testing.assert_close(rows, F.cross_entropy(z.to(torch.bfloat16).float(), y, ignore_index=-1,
                                                     reduction="none"), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(zb.float(), ref_grad.float(), rtol=2e-2, atol=1e-3)
    nothing = torch.full_like(y, -1)
    g = z.clone()
    assert lck.ce_rows(g, nothing, scale).abs().max() == 0 and g.abs().max() == 0
    assert lck.ce_rows(z.clone(), y, scale, with_grad=False).shape == (5,)
    with pytest.raises(ValueError, match="unit column stride"):
        lck.ce_rows(z.t(), y, scale)
