"""kernels/attention/cp.py: decayed attention over a sequence split across 2 and 4 gloo processes equals the
reference over the whole sequence, outputs and every gradient: softmax, a forget gate (FoX), ALiBi's slopes and the
gated power path (sympow), in float64 through the Tq <= Tk form and in float32 through the Triton kernel on padded
queries (the interpreter on a CPU); with packed documents too (one starting at a slice's first token, one crossing a
slice boundary, one spanning three slices, one of a single token)."""

import os

import pytest
import torch
from conftest import spawn_ranks

from duality.kernels.attention import cumulative_log_decay, decayed_attention_reference
from duality.kernels.attention.cp import decayed_attention_cp
from duality.kernels.varlen import slice_boundaries

CASES = {"softmax": {}, "gate": {"gate": True}, "alibi": {"slopes": True}, "power": {"gate": True, "power": 2}}


def documents(T: int):
    """One packed row's boundaries (with 4 slices of 9, T = 36: as tests/kernels/test_recurrences_cp.py's)."""
    return torch.tensor([0, 5, 9, 20, 21, T])


def inputs(T: int, case: str, dtype, seed: int = 0, B: int = 2):
    gen = torch.Generator().manual_seed(seed)
    H, D = 2, 16
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype)  # the same numbers in any dtype  # noqa: E731
    f = torch.nn.functional.logsigmoid(r(B, T, H) + 2)  # a log forget gate per head and token
    return r(B, T, H, D), r(B, T, H, D), r(B, T, H, D), f, r(B, T, H, D)


def scores(case: str, f, slopes_dtype):
    opts = CASES[case]
    return {"log_decay": cumulative_log_decay(f) if opts.get("gate") else None, "power": opts.get("power"),
            "slopes": torch.tensor([0.5, 0.125], dtype=slopes_dtype) if opts.get("slopes") else None}


def rank_main(rank: int, world: int, T: int, case: str, impl: str, docs: bool, out: str):
    dtype = torch.float64 if impl == "torch" else torch.float32
    n = T // world
    part = [x[:, rank * n:(rank + 1) * n].clone().requires_grad_(i < 4)
            for i, x in enumerate(inputs(T, case, dtype, B=1 if docs else 2))]
    q, k, v, f, w = part
    cu = slice_boundaries(documents(T), rank * n, n) if docs else None
    o = decayed_attention_cp(q, k, v, **scores(case, f, dtype), scale=0.3, impl=impl, cu_seqlens=cu)
    (o * w).sum().backward()
    torch.save({"o": o.detach(), **{name: x.grad for name, x in zip("qkvf", part[:4])}}, f"{out}.{rank}")


def split_equals_whole(tmp_path, world: int, T: int, case: str, impl: str, tol: float, docs: bool = False):
    spawn_ranks(rank_main, world, T, case, impl, docs, str(tmp_path / "r"))
    q, k, v, f, w = (x.requires_grad_(i < 4) for i, x in enumerate(inputs(T, case, torch.float64, B=1 if docs else 2)))
    o = decayed_attention_reference(q, k, v, **scores(case, f, torch.float64), scale=0.3,
                                    cu_seqlens=documents(T) if docs else None)
    (o * w).sum().backward()
    parts = [torch.load(tmp_path / f"r.{r}") for r in range(world)]
    got = torch.cat([p["o"] for p in parts], 1).double()
    torch.testing.assert_close(got, o.detach(), rtol=tol, atol=tol)
    for name, x in zip("qkvf", (q, k, v, f)):
        if x.grad is None:  # no gate in this case
            continue
        torch.testing.assert_close(torch.cat([p[name] for p in parts], 1).double(), x.grad, rtol=tol, atol=tol,
                                   msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.slow
@pytest.mark.parametrize("world, T, case, docs", [(2, 34, "softmax", False), (4, 36, "gate", False),
                                                   (2, 30, "alibi", False), (4, 28, "power", False),
                                                   (4, 36, "softmax", True), (4, 36, "gate", True),
                                                   (2, 34, "alibi", True)])
def test_split_sequence_equals_the_whole(tmp_path, world, T, case, docs):
    split_equals_whole(tmp_path, world, T, case, "torch", 1e-10, docs)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the kernel in Triton's interpreter (CPU)")
@pytest.mark.parametrize("case, docs", [("gate", False), ("power", False), ("gate", True)])
def test_the_kernel_on_padded_queries_equals_the_whole(tmp_path, case, docs):
    split_equals_whole(tmp_path, 2, 40, case, "triton", 2e-4, docs)
