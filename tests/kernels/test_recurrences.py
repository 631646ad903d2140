"""The recurrences (kernels/recurrences/): each exact chunked form equals the token-by-token definition (with an
initial state, at lengths below, at and across the chunk of 16), and the dispatch convention (impl=None|"torch"|"fla").
FLA's kernels against these references: tests/test_gpu.py."""

import math

import pytest
import torch
from conftest import DEV, interp, qkv

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


@pytest.mark.slow  # importing FLA: 4 s
def test_gla_runs_fla_s_own_chunk_gla_under_another_fla(monkeypatch):
    """_GLA calls FLA 0.6.0's private chunk_gla_* functions, so under another FLA (or DUALITY_GLA_DV=fla) GLA runs
    FLA's public chunk_gla instead, warning once, rather than fail inside a backward; the version it checks is the
    one pyproject pins. The kernels are stand-ins that name themselves (they need CUDA); the choice is the code's."""
    import tomllib
    from pathlib import Path

    import fla
    import fla.ops.gla

    from duality.kernels.recurrences import fla as via_fla
    pins = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"flash-linear-attention=={via_fla.FLA_INTERNALS}" in pins
    monkeypatch.setattr(fla.ops.gla, "chunk_gla", lambda *a, **kw: "fla's chunk_gla")
    monkeypatch.setattr(via_fla._GLA, "apply", lambda *a: "_GLA")
    q, k, v = qkv(1, 4, 1, 2, 2)
    g = torch.zeros(1, 4, 1, 2)  # a gate per channel (a scalar one takes chunk_simple_gla)

    def which(version, env=None):
        via_fla.fla_is_the_pinned_one.cache_clear()
        monkeypatch.setattr(fla, "__version__", version)
        if env:
            monkeypatch.setenv("DUALITY_GLA_DV", env)
        return via_fla.gated(q, k, v, g, 1.0)

    assert which(via_fla.FLA_INTERNALS) == "_GLA"
    assert which(via_fla.FLA_INTERNALS, env="fla") == "fla's chunk_gla"
    monkeypatch.delenv("DUALITY_GLA_DV")
    with pytest.warns(UserWarning, match=r"flash-linear-attention 0\.7\.0 is not 0\.6\.0.*FLA's own chunk_gla"):
        assert which("0.7.0") == "fla's chunk_gla"
    via_fla.fla_is_the_pinned_one.cache_clear()


# ----------------------------------------------------------------- GLA backward's value gradient (gla_dv.py)
def _local_log2_cumsum(g, C):
    """FLA's G: the gate's cumulative sum within each chunk of C tokens, in log2."""
    return torch.cat([g[:, s:s + C].cumsum(1) for s in range(0, g.shape[1], C)], 1) / math.log(2)


@pytest.mark.parametrize("T", [16, 37])
def test_gla_bwd_dv_reference_is_the_value_gradient(T):
    """The chunked formula of dv (FLA's A and state gradients dh, built here from the recurrence's definitions)
    equals the gradient of the chunked GLA in float64, with chunks of 16 (T = 37: a last chunk of 5)."""
    from duality.kernels.recurrences.reference import gla_bwd_dv_reference
    torch.manual_seed(0)
    B, H, K, V, C, scale = 2, 3, 4, 5, 16, 0.3
    q, k, v = (torch.randn(B, T, H, d, dtype=torch.float64) for d in (K, K, V))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, dtype=torch.float64))
    do = torch.randn(B, T, H, V, dtype=torch.float64)
    v.requires_grad_()
    want = torch.autograd.grad((gated_chunked(q, k, v, g, scale)[0] * do).sum(), v)[0]
    G = _local_log2_cumsum(g, C)
    A = torch.zeros(B, T, H, C, dtype=torch.float64)
    dh = []
    total = g.cumsum(1)  # natural log, over the whole sequence
    for s in range(0, T, C):
        n = min(C, T - s)
        diff = (G[:, s:s + n, None] - G[:, None, s:s + n]).masked_fill(
            ~torch.ones(n, n, dtype=torch.bool).tril()[None, :, :, None, None], float("-inf"))
        A[:, s:s + n, :, :n] = scale * torch.einsum("bthk,bihk,btihk->bthi", q[:, s:s + n], k[:, s:s + n],
                                                    torch.exp2(diff))
        e = s + n - 1  # the chunk's last token: its state reaches every later token t through exp(sum of g)
        qd = scale * q[:, e + 1:] * torch.exp(total[:, e + 1:] - total[:, e:e + 1])
        dh.append(torch.einsum("bthk,bthv->bhkv", qd, do[:, e + 1:]))
    got = gla_bwd_dv_reference(k, G, A, do, torch.stack(dh, 1), C)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def _dv_inputs(B, T, H, K, V, C, NT, seed):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(B, T, H, K, generator=gen).bfloat16()
    g = _local_log2_cumsum(-torch.rand(B, T, H, K, generator=gen) * 0.2, C)  # 2^(G_last - G) from 1 to ~1e-3
    A = torch.randn(B, T, H, C, generator=gen)
    do = torch.randn(B, T, H, V, generator=gen)
    dh = torch.randn(B, NT, H, K, V, generator=gen)
    return k, g, A, do, dh


@interp
@pytest.mark.parametrize("T,K,V,C", [(100, 32, 64, 64), (37, 20, 24, 16), (64, 16, 80, 32)])
def test_gla_bwd_dv_kernel_matches_the_reference(T, K, V, C):
    """gla_dv.py's kernel (Triton's interpreter on a CPU) against the formula in float64, at awkward lengths and head
    sizes: the intra-chunk term alone (dh = 0) to fp32 accuracy, then both terms to the bf16 accuracy of the second
    (FLA's rounding: k 2^(G_last - G) and dh multiplied in bf16)."""
    from duality.kernels.recurrences.gla_dv import gla_bwd_dv
    from duality.kernels.recurrences.reference import gla_bwd_dv_reference
    NT = -(-T // C)
    k, g, A, do, dh = _dv_inputs(2, T, 3, K, V, C, NT, seed=T)
    for dh_ in (torch.zeros_like(dh), dh):
        got = gla_bwd_dv(k.to(DEV), g.to(DEV), A.to(DEV), do.to(DEV), dh_.to(DEV), chunk_size=C).cpu().double()
        want = gla_bwd_dv_reference(k, g, A, do, dh_, C)
        err = ((got - want).norm() / want.norm()).item()
        assert err < (1e-5 if dh_ is not dh else 1e-2), err


@interp
def test_gla_bwd_dv_kernel_over_packed_documents():
    """Packed documents (B = 1, cu_seqlens, FLA's chunk_indices): each document's rows equal the formula on that
    document alone, with its own chunks' state gradients."""
    from duality.kernels.recurrences.gla_dv import gla_bwd_dv
    from duality.kernels.recurrences.reference import gla_bwd_dv_reference
    C, bounds = 16, [0, 37, 53, 100]
    docs = [(s, e, -(-(e - s) // C)) for s, e in zip(bounds[:-1], bounds[1:])]
    chunks = torch.tensor([[n, t] for n, (_, _, nt) in enumerate(docs) for t in range(nt)])
    k, _, A, do, dh = _dv_inputs(1, bounds[-1], 2, 8, 12, C, len(chunks), seed=5)
    g = torch.cat([_local_log2_cumsum(-torch.rand(1, e - s, 2, 8) * 0.2, C) for s, e, _ in docs], 1)
    with pytest.raises(ValueError, match="need chunk_indices"):
        gla_bwd_dv(k, g, A, do, dh, cu_seqlens=torch.tensor(bounds), chunk_size=C)
    got = gla_bwd_dv(*(x.to(DEV) for x in (k, g, A, do, dh)), cu_seqlens=torch.tensor(bounds, device=DEV),
                     chunk_size=C, chunk_indices=chunks.to(DEV)).cpu().double()
    first = 0
    for s, e, nt in docs:
        want = gla_bwd_dv_reference(k[:, s:e], g[:, s:e], A[:, s:e], do[:, s:e], dh[:, first:first + nt], C)
        first += nt
        err = ((got[:, s:e] - want).norm() / want.norm()).item()
        assert err < 1e-2, (s, e, err)
