"""kernels/recurrences/cp.py: the gated recurrence and the (gated) delta rule over a sequence split across 2 and 4
gloo processes equal the token-by-token recurrence over the whole sequence, outputs and every gradient, in
float64."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from duality.kernels.recurrences import delta_rule_recurrent, gated_recurrent
from duality.kernels.recurrences.cp import delta_rule_cp, gated_cp


def inputs(T: int, scalar_gate: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    B, H, K, V = 2, 3, 5, 4
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    g = -torch.rand(B, T, H, 1 if scalar_gate else K, generator=gen, dtype=torch.float64) * 0.3  # log gates <= 0
    return r(B, T, H, K), r(B, T, H, K), r(B, T, H, V), g, r(B, T, H, V)


def rank_main(rank: int, world: int, port: int, T: int, scalar_gate: bool, out: str):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        q, k, v, g, w = inputs(T, scalar_gate)
        n = T // world
        part = [x[:, rank * n:(rank + 1) * n].clone().requires_grad_(x is not w) for x in (q, k, v, g, w)]
        o = gated_cp(*part[:4], 0.5, impl="torch")
        (o * part[4]).sum().backward()
        torch.save({"o": o.detach(), **{name: x.grad for name, x in zip("qkvg", part[:4])}}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("world, T, scalar_gate", [(2, 34, False), (4, 44, False), (4, 36, True)])
def test_split_sequence_equals_the_whole(tmp_path, world, T, scalar_gate):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(world, port, T, scalar_gate, str(tmp_path / "r")), nprocs=world, join=True)
    q, k, v, g, w = (x.requires_grad_(True) for x in inputs(T, scalar_gate))
    o, _ = gated_recurrent(q, k, v, g, 0.5)
    (o * w).sum().backward()
    parts = [torch.load(tmp_path / f"r.{r}") for r in range(world)]
    torch.testing.assert_close(torch.cat([p["o"] for p in parts], 1), o.detach(), rtol=1e-10, atol=1e-10)
    for name, x in zip("qkvg", (q, k, v, g)):
        torch.testing.assert_close(torch.cat([p[name] for p in parts], 1), x.grad, rtol=1e-10, atol=1e-10,
                                   msg=lambda m, n=name: f"d{n}: {m}")


def delta_inputs(T: int, gated: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    B, H, K, V = 2, 3, 5, 4
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    k = torch.nn.functional.normalize(r(B, T, H, K), dim=-1)  # as the mixers feed it: |k| = 1, beta in (0, 1)
    beta, g = torch.rand(B, T, H, generator=gen, dtype=torch.float64), -torch.rand(B, T, H, generator=gen,
                                                                                      dtype=torch.float64) * 0.2
    return r(B, T, H, K), k, r(B, T, H, V), beta, g if gated else None, r(B, T, H, V)


def delta_rank_main(rank: int, world: int, port: int, T: int, gated: bool, out: str):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        n = T // world
        part = [None if x is None else x[:, rank * n:(rank + 1) * n].clone().requires_grad_(i < 5)
                for i, x in enumerate(delta_inputs(T, gated))]
        q, k, v, beta, g, w = part
        o = delta_rule_cp(q, k, v, beta, 0.5, g, impl="torch")
        (o * w).sum().backward()
        torch.save({"o": o.detach(), **{name: x.grad for name, x in zip(("q", "k", "v", "beta", "g"), part[:5])
                                        if x is not None}}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("world, T, gated", [(2, 34, False), (4, 36, True)])
def test_split_delta_rule_equals_the_whole(tmp_path, world, T, gated):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(delta_rank_main, args=(world, port, T, gated, str(tmp_path / "r")), nprocs=world, join=True)
    q, k, v, beta, g, w = (None if x is None else x.requires_grad_(i < 5) for i, x in enumerate(delta_inputs(T, gated)))
    o, _ = delta_rule_recurrent(q, k, v, beta, 0.5, g)
    (o * w).sum().backward()
    parts = [torch.load(tmp_path / f"r.{r}") for r in range(world)]
    torch.testing.assert_close(torch.cat([p["o"] for p in parts], 1), o.detach(), rtol=1e-10, atol=1e-10)
    for name, x in zip(("q", "k", "v", "beta", "g"), (q, k, v, beta, g)):
        if x is not None:
            torch.testing.assert_close(torch.cat([p[name] for p in parts], 1), x.grad, rtol=1e-10, atol=1e-10,
                                       msg=lambda m, n=name: f"d{n}: {m}")
