"""kernels/recurrences/cp.py: the gated recurrence over a sequence split across 2 and 4 gloo processes equals the
token-by-token recurrence over the whole sequence, outputs and every gradient, in float64."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from duality.kernels.recurrences import gated_recurrent
from duality.kernels.recurrences.cp import gated_cp


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
