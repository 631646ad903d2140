"""Fused linear + cross-entropy (kernels/linear_ce/) against the plain formula, and the GPT's loss through it."""

import pytest
import torch
import torch.nn.functional as F

import duality.kernels.linear_ce.chunked as lce
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


def test_model_loss_and_gradients_equal_the_plain_logits_path(monkeypatch):
    """What training optimises (the fused loss) is the cross-entropy of the logits the model returns."""
    monkeypatch.setattr(lce, "CHUNK_ELEMENTS", 512 * 64)  # several chunks of 64 tokens
    m = build_model({"name": "transformer"}, {"name": "rope"},
                    {"n_layer": 2, "d_model": 32, "n_heads": 2, "seq_len": 64, "tie_embeddings": True,
                     "fused_loss": True}, 512).double()
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
    with pytest.raises(ValueError, match="impl must be"):
        linear_cross_entropy(h, w, y, impl="triton")
