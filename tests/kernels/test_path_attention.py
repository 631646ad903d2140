"""PaTH attention (kernels/path_attention/): the T-sweep scores equal the explicit Householder products, the
reference equals the formula with a FoX gate, and the dispatch convention. FLA's kernel: tests/test_gpu.py."""

import pytest
import torch
from conftest import householder_product_scores, qkv

from duality.kernels.path_attention import path_attention, path_attention_reference, path_scores


def test_path_scores_equal_the_householder_products():
    q, k, _ = qkv(B=1, T=9, H=2, D=4)
    w = torch.nn.functional.normalize(torch.randn(1, 9, 2, 4), dim=-1)
    beta = 2 * torch.rand(1, 9, 2)
    torch.testing.assert_close(path_scores(q, k, w, beta), householder_product_scores(q, k, w, beta))


def test_path_attention_reference_with_fox_gate_matches_formula():
    q, k, v = qkv(B=1, T=7, H=2, D=4)
    w = torch.nn.functional.normalize(torch.randn(1, 7, 2, 4), dim=-1)
    beta, f = 2 * torch.rand(1, 7, 2), torch.nn.functional.logsigmoid(torch.randn(1, 7, 2))
    c = torch.cumsum(f, 1)
    ct = c.transpose(1, 2)
    s = householder_product_scores(q, k, w, beta) / 2 + (ct[..., :, None] - ct[..., None, :])
    s = s.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.einsum("bhij,bjhd->bihd", torch.softmax(s, -1), v)
    torch.testing.assert_close(path_attention_reference(q, k, v, w, beta, c, scale=0.5), ref)


def test_dispatch_convention():
    q, k, v = qkv(B=1, T=6, H=2, D=4)
    w = torch.nn.functional.normalize(torch.randn(1, 6, 2, 4), dim=-1)
    beta = torch.rand(1, 6, 2)
    ref = path_attention_reference(q, k, v, w, beta, None, scale=0.5)
    torch.testing.assert_close(path_attention(q, k, v, w, beta, scale=0.5), ref)
    torch.testing.assert_close(path_attention(q, k, v, w, beta, scale=0.5, impl="torch"), ref)
    with pytest.raises(ValueError, match="impl='fla' needs CUDA"):
        path_attention(q, k, v, w, beta, impl="fla")
    with pytest.raises(ValueError, match="impl must be None, 'torch' or 'fla'"):
        path_attention(q, k, v, w, beta, impl="chunked")


def test_heads_padded_with_zeros_give_the_same_attention_and_gradients():
    """kernels/path_attention/fla.py pads heads of 32 to 64 (FLA's backward faults at 32): exact, in float64."""
    from duality.kernels.path_attention.fla import pad_heads
    B, T, H, D = 2, 11, 3, 5
    q, k, v = (torch.randn(B, T, H, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    w = torch.nn.functional.normalize(torch.randn(B, T, H, D, dtype=torch.float64), dim=-1).requires_grad_()
    beta = (2 * torch.rand(B, T, H, dtype=torch.float64)).requires_grad_()
    c = torch.cumsum(torch.nn.functional.logsigmoid(torch.randn(B, T, H, dtype=torch.float64)), 1)
    ref = path_attention_reference(q, k, v, w, beta, c, scale=D ** -0.5)
    padded = pad_heads(q, k, v, w, size=8)
    assert padded[0].shape == (B, T, H, 8) and padded[3][..., D:].abs().max() == 0
    out = path_attention_reference(*padded, beta, c, scale=D ** -0.5)
    assert out[..., D:].abs().max() == 0
    torch.testing.assert_close(out[..., :D], ref)
    g = torch.randn_like(ref)
    grads = torch.autograd.grad((ref * g).sum(), (q, k, v, w, beta))
    grads_padded = torch.autograd.grad((out[..., :D] * g).sum(), (q, k, v, w, beta))
    for a, b in zip(grads, grads_padded):
        torch.testing.assert_close(b, a)
    assert pad_heads(q, k, v, w, size=D)[0] is q   # wide enough: unchanged


def test_path_fault_reads_a_cases_outcome_from_its_process_output():
    """reproductions/path_fault.py (the upstream reproduction, a GPU script): a fault's outcome is the last line that
    names an error, not CUDA's advice after it (the first record took that line); a clean case is its "ok" line."""
    import path_fault  # (reproductions/ is on the path: conftest)
    fault = ("Traceback (most recent call last):\n  File \"path_fault.py\", line 70, in child\n"
             "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
             "Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/ for more information.\n")
    assert path_fault.outcome(1, fault) == fault.splitlines()[2]  # torch.AcceleratorError: CUDA error: an illegal ...
    assert path_fault.outcome(0, "compiling\nok\n") == "ok"
    assert path_fault.outcome(0, "ok, but a gradient is not finite") == "ok, but a gradient is not finite"
    assert path_fault.outcome(1, "ok\n") == "exit 1 after: ok"  # a failed exit is never read as "ok"
    assert path_fault.outcome(-11, "") == "exit -11"  # killed with nothing printed (a segfault)
