"""The recurrences (kernels/recurrences/): each exact chunked form equals the token-by-token definition (with an
initial state, at lengths below, at and across the chunk of 16), and the dispatch convention (impl=None|"torch"|"fla").
FLA's kernels against these references: tests/test_gpu.py."""

import pytest
import torch
from conftest import qkv

from duality.kernels.recurrences import (
    delta_rule,
    delta_rule_chunked,
    delta_rule_recurrent,
    gated,
    gated_chunked,
    gated_recurrent,
    oja,
    oja_recurrent,
)


@pytest.mark.parametrize("T", [1, 16, 37])
@pytest.mark.parametrize("scalar", [False, True])
def test_gated_chunked_equals_recurrent(T, scalar):
    q, k, v = qkv(T=T)
    g = torch.nn.functional.logsigmoid(torch.randn(2, T, 3, 1 if scalar else 8)) * 3
    S0 = torch.randn(2, 3, 8, 8)
    o1, S1 = gated_chunked(q, k, v, g, 0.3, S0)
    o2, S2 = gated_recurrent(q, k, v, g, 0.3, S0)
    torch.testing.assert_close(o1, o2)
    torch.testing.assert_close(S1, S2)


@pytest.mark.parametrize("T", [1, 16, 37])
@pytest.mark.parametrize("gated", [False, True])
def test_delta_rule_chunked_equals_recurrent(T, gated):
    q, k, v = qkv(T=T)
    k = torch.nn.functional.normalize(k, dim=-1)
    beta = 2 * torch.rand(2, T, 3)
    g = torch.nn.functional.logsigmoid(torch.randn(2, T, 3)) if gated else None
    S0 = torch.randn(2, 3, 8, 8)
    o1, S1 = delta_rule_chunked(q, k, v, beta, 0.3, g, S0)
    o2, S2 = delta_rule_recurrent(q, k, v, beta, 0.3, g, S0)
    torch.testing.assert_close(o1, o2)
    torch.testing.assert_close(S1, S2)


def test_dispatch_convention():
    """impl=None and "torch" take the references on a CPU (equal outputs); "fla" on CPU tensors and unknown names
    are refused with the valid choices."""
    q, k, v = qkv(T=5)
    g = torch.nn.functional.logsigmoid(torch.randn(2, 5, 3, 8))
    beta, gv = torch.rand(2, 5, 3), torch.nn.functional.logsigmoid(torch.randn(2, 5, 3, 8))
    calls = {"gated": (gated, gated_recurrent, (q, k, v, g, 0.3)),
             "delta_rule": (delta_rule, delta_rule_recurrent, (q, k, v, beta, 0.3)),
             "oja": (oja, oja_recurrent, (q, k, v, gv, beta, 0.3))}
    for name, (fn, recurrent, args) in calls.items():
        torch.testing.assert_close(fn(*args)[0], recurrent(*args)[0])
        torch.testing.assert_close(fn(*args, impl="torch")[0], recurrent(*args)[0])
        with pytest.raises(ValueError, match=f"{name}: impl='fla' needs CUDA"):
            fn(*args, impl="fla")
        with pytest.raises(ValueError, match=r"impl must be None, 'torch' or 'fla', got 'triton'"):
            fn(*args, impl="triton")
