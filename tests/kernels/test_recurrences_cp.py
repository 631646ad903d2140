"""kernels/recurrences/cp.py: the gated recurrence and the (gated) delta rule over a sequence split across 2 and 4
gloo processes equal the token-by-token recurrence over the whole sequence, outputs and every gradient, in
float64; with packed documents too (a row whose documents start at a slice's first token, cross one slice boundary
or span three slices, one of a single token), against the recurrence run on each document alone."""


import pytest
import torch
from conftest import spawn_ranks

from duality.kernels.recurrences import delta_rule_recurrent, gated_recurrent, oja_recurrent
from duality.kernels.recurrences.cp import delta_rule_cp, gated_cp, oja_cp
from duality.kernels.varlen import per_document, slice_boundaries


def documents(T: int):
    """Boundaries of one packed row: with 4 slices of 9 (T = 36) a document starts at slice 1's first token, one
    crosses into slice 2 and the last spans slices 2 to 3; 21 is a one-token document."""
    return torch.tensor([0, 5, 9, 20, 21, T])


def inputs(T: int, scalar_gate: bool, seed: int = 0, B: int = 2):
    gen = torch.Generator().manual_seed(seed)
    H, K, V = 3, 5, 4
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    g = -torch.rand(B, T, H, 1 if scalar_gate else K, generator=gen, dtype=torch.float64) * 0.3  # log gates <= 0
    return r(B, T, H, K), r(B, T, H, K), r(B, T, H, V), g, r(B, T, H, V)


def rank_main(rank: int, world: int, T: int, scalar_gate: bool, docs: bool, out: str):
    q, k, v, g, w = inputs(T, scalar_gate, B=1 if docs else 2)
    n = T // world
    part = [x[:, rank * n:(rank + 1) * n].clone().requires_grad_(x is not w) for x in (q, k, v, g, w)]
    cu = slice_boundaries(documents(T), rank * n, n) if docs else None
    o = gated_cp(*part[:4], 0.5, impl="torch", cu_seqlens=cu)
    (o * part[4]).sum().backward()
    torch.save({"o": o.detach(), **{name: x.grad for name, x in zip("qkvg", part[:4])}}, f"{out}.{rank}")


@pytest.mark.slow
@pytest.mark.parametrize("world, T, scalar_gate, docs", [(2, 34, False, False), (4, 44, False, False),
                                                         (4, 36, True, False), (4, 36, False, True),
                                                         (2, 34, True, True)])
def test_split_sequence_equals_the_whole(tmp_path, world, T, scalar_gate, docs):
    spawn_ranks(rank_main, world, T, scalar_gate, docs, str(tmp_path / "r"))
    q, k, v, g, w = (x.requires_grad_(True) for x in inputs(T, scalar_gate, B=1 if docs else 2))
    if docs:
        o = per_document(lambda *a: gated_recurrent(*a)[0], documents(T), q, k, v, g, 0.5)
    else:
        o, _ = gated_recurrent(q, k, v, g, 0.5)
    (o * w).sum().backward()
    parts = [torch.load(tmp_path / f"r.{r}") for r in range(world)]
    torch.testing.assert_close(torch.cat([p["o"] for p in parts], 1), o.detach(), rtol=1e-10, atol=1e-10)
    for name, x in zip("qkvg", (q, k, v, g)):
        torch.testing.assert_close(torch.cat([p[name] for p in parts], 1), x.grad, rtol=1e-10, atol=1e-10,
                                   msg=lambda m, n=name: f"d{n}: {m}")


def delta_inputs(T: int, gated: bool, seed: int = 0, B: int = 2):
    gen = torch.Generator().manual_seed(seed)
    H, K, V = 3, 5, 4
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    k = torch.nn.functional.normalize(r(B, T, H, K), dim=-1)  # as the mixers feed it: |k| = 1, beta in (0, 1)
    beta, g = torch.rand(B, T, H, generator=gen, dtype=torch.float64), -torch.rand(B, T, H, generator=gen,
                                                                                      dtype=torch.float64) * 0.2
    return r(B, T, H, K), k, r(B, T, H, V), beta, g if gated else None, r(B, T, H, V)


def delta_rank_main(rank: int, world: int, T: int, gated: bool, docs: bool, out: str):
    n = T // world
    part = [None if x is None else x[:, rank * n:(rank + 1) * n].clone().requires_grad_(i < 5)
            for i, x in enumerate(delta_inputs(T, gated, B=1 if docs else 2))]
    q, k, v, beta, g, w = part
    cu = slice_boundaries(documents(T), rank * n, n) if docs else None
    o = delta_rule_cp(q, k, v, beta, 0.5, g, impl="torch", cu_seqlens=cu)
    (o * w).sum().backward()
    torch.save({"o": o.detach(), **{name: x.grad for name, x in zip(("q", "k", "v", "beta", "g"), part[:5])
                                    if x is not None}}, f"{out}.{rank}")


@pytest.mark.slow
@pytest.mark.parametrize("world, T, gated, docs", [(2, 34, False, False), (4, 36, True, False), (4, 36, True, True),
                                                    (2, 34, False, True)])
def test_split_delta_rule_equals_the_whole(tmp_path, world, T, gated, docs):
    spawn_ranks(delta_rank_main, world, T, gated, docs, str(tmp_path / "r"))
    q, k, v, beta, g, w = (None if x is None else x.requires_grad_(i < 5)
                           for i, x in enumerate(delta_inputs(T, gated, B=1 if docs else 2)))
    if docs:
        o = per_document(lambda *a: delta_rule_recurrent(*a)[0], documents(T), q, k, v, beta, 0.5, g)
    else:
        o, _ = delta_rule_recurrent(q, k, v, beta, 0.5, g)
    (o * w).sum().backward()
    parts = [torch.load(tmp_path / f"r.{r}") for r in range(world)]
    torch.testing.assert_close(torch.cat([p["o"] for p in parts], 1), o.detach(), rtol=1e-10, atol=1e-10)
    for name, x in zip(("q", "k", "v", "beta", "g"), (q, k, v, beta, g)):
        if x is not None:
            torch.testing.assert_close(torch.cat([p[name] for p in parts], 1), x.grad, rtol=1e-10, atol=1e-10,
                                       msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.parametrize("start, want", [(0, [0, 5, 9]), (9, [0, 9]), (18, [-9, 2, 3, 9]), (27, [-6, 9])])
def test_a_slice_sees_the_boundaries_in_its_own_coordinates(start, want):
    """slice_boundaries: from the start of the first token's document (<= 0) to the slice's end; the positions they
    give are the tokens' positions in their documents, as the whole row's boundaries give them."""
    from duality.kernels.varlen import document_positions
    cu = slice_boundaries(documents(36), start, 9)
    assert cu.tolist() == want
    assert torch.equal(document_positions(cu, 9), document_positions(documents(36), 36)[start:start + 9])


def oja_inputs(T: int, B: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    H, K, V = 2, 5, 4
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    v = torch.nn.functional.normalize(r(B, T, H, V), dim=-1)  # as the mixer feeds it: |v| = 1, beta in (0, 1)
    gv = -torch.rand(B, T, H, V, generator=gen, dtype=torch.float64) * 0.2
    return r(B, T, H, K), r(B, T, H, K), v, gv, torch.rand(B, T, H, generator=gen, dtype=torch.float64), r(B, T, H, V)


def oja_rank_main(rank: int, world: int, T: int, docs: bool, out: str):
    n = T // world
    part = [x[:, rank * n:(rank + 1) * n].clone().requires_grad_(i < 5)
            for i, x in enumerate(oja_inputs(T, 1 if docs else 2))]
    cu = slice_boundaries(documents(T), rank * n, n) if docs else None
    o = oja_cp(*part[:5], 0.5, impl="torch", cu_seqlens=cu)
    (o * part[5]).sum().backward()
    torch.save({"o": o.detach(), **{name: x.grad for name, x in zip(("q", "k", "v", "gv", "beta"), part[:5])}},
               f"{out}.{rank}")


@pytest.mark.slow
@pytest.mark.parametrize("world, T, docs", [(2, 34, False), (4, 36, False), (4, 36, True)])
def test_split_oja_rule_equals_the_whole(tmp_path, world, T, docs):
    """The gated Oja rule's value-side transition handed over: outputs and every gradient of the whole sequence."""
    spawn_ranks(oja_rank_main, world, T, docs, str(tmp_path / "r"))
    q, k, v, gv, beta, w = (x.requires_grad_(i < 5) for i, x in enumerate(oja_inputs(T, 1 if docs else 2)))
    if docs:
        o = per_document(lambda *a: oja_recurrent(*a)[0], documents(T), q, k, v, gv, beta, 0.5)
    else:
        o, _ = oja_recurrent(q, k, v, gv, beta, 0.5)
    (o * w).sum().backward()
    parts = [torch.load(tmp_path / f"r.{r}") for r in range(world)]
    torch.testing.assert_close(torch.cat([p["o"] for p in parts], 1), o.detach(), rtol=1e-10, atol=1e-10)
    for name, x in zip(("q", "k", "v", "gv", "beta"), (q, k, v, gv, beta)):
        torch.testing.assert_close(torch.cat([p[name] for p in parts], 1), x.grad, rtol=1e-10, atol=1e-10,
                                   msg=lambda m, n=name: f"d{n}: {m}")
