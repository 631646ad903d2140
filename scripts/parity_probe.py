"""What a trained S2 (parity) model of GLA + Selective RoPE uses, and what stops it extrapolating.

    python scripts/parity_probe.py RUN/checkpoints/step_0018600.pt [--examples 256] [--top 5]

Parity is solved by one rotary pair that turns by pi for a 1 and by 0 for a 0: then the score of the <bos> key
read at t is +-1 by the parity of the prefix. The script prints, for every (head, pair), the angle each token adds
(in a run of that token, so the short convolution's taps are summed: the sum over a sequence telescopes to that),
and the pairs closest to that rule, with the length at which the pair's angle error would reach pi/2. Then it
scores the model again with the forget gate of the closest pair's two channels scaled by c = 1, 0.5, 0.25, 0 (c = 0:
that pair never forgets the <bos> key): if the rotation is right and the gate is what forgets the reference,
accuracy beyond the training length rises as c falls (docs/synthetic, "S2's extrapolation gap"). Before that it
prints the first position the model gets wrong on runs of one token (the parity rule gets them right at any length),
its score without Selective RoPE's bias (an angle that does not depend on the input, RoPE's kind), and the periods
with which its errors beyond the training length recur (docs/synthetic, "The seed's full schedule").
"""

from __future__ import annotations

import argparse
import math
from contextlib import contextmanager

import numpy as np
import torch

from duality.data import tasks
from duality.trainer.checkpoint import load_model


def token_angles(model, tokens: list[int], bos: int, run: int = 16) -> torch.Tensor:
    """[len(tokens), H, D/2] angle (temperature applied) that one more token adds in a run of it, after <bos>."""
    pe = model.blocks[0].mixer.pe
    seen = {}
    increments = pe.increments

    def spy(q, x, ctx=None):
        out = increments(q, x) if ctx is None else increments(q, x, ctx)
        seen["dphi"] = out.detach()
        return out
    pe.increments = spy
    try:
        with torch.no_grad():
            model(torch.tensor([[bos] + [t] * run for t in tokens]))
    finally:
        del pe.increments  # the class's method again
    return seen["dphi"][:, run // 2].double() * pe.theta.double()  # past the convolution's reach into <bos>


def wrap(a: torch.Tensor) -> torch.Tensor:
    return torch.remainder(a + math.pi, 2 * math.pi) - math.pi


def parity_pairs(angles: torch.Tensor) -> list[dict]:
    """Every (head, pair) by how far it is from "a 1 turns by pi, a 0 by 0": the two errors and the length at which
    they would add up to pi/2 (half the tokens ones), closest first."""
    e1, e0 = wrap(angles[1] - angles[0] - math.pi).abs(), wrap(angles[0]).abs()
    rows = [{"head": h, "pair": i, "angle_0": angles[0, h, i].item(), "angle_1": angles[1, h, i].item(),
             "err_1": e1[h, i].item(), "err_0": e0[h, i].item(),
             "length": math.pi / (e1[h, i].item() + e0[h, i].item() + 1e-12)}
            for h in range(e1.shape[0]) for i in range(e1.shape[1])]
    return sorted(rows, key=lambda r: r["err_1"] + r["err_0"])


def error_periods(curve: dict, after: int, top: int = 3) -> list[tuple[float, float]]:
    """The strongest periods, in tokens, of the error (1 - accuracy at each length) beyond length `after`, each with
    its share of the error's variance. Errors that recur at fixed positions, whatever the input, are what a rotation
    that does not depend on the input (RoPE's kind) gives past the training length (docs/synthetic, "The seed's full
    schedule")."""
    err = 1 - np.array([curve[n] for n in sorted(curve) if n > after], dtype=np.float64)
    power = np.abs(np.fft.rfft(err - err.mean()))[1:] ** 2  # bin 0 is the mean
    periods = len(err) / np.arange(1, len(power) + 1)
    best = np.argsort(power)[::-1][:top]
    return [(float(periods[k]), float(power[k] / power.sum())) for k in best]


def first_wrong(model, token: int, bos: int, length: int) -> int | None:
    """The first position of <bos> + `length` copies of `token` at which the model's answer is not the running parity
    (None: right throughout). The parity rule in the angles is right on these as on any input; a solution that leans
    on the mix of tokens seen in training is not."""
    x = torch.tensor([[bos] + [token] * length])
    with torch.no_grad():
        answer = model(x)[0][0, 1:, :2].argmax(-1)
    parity = torch.cumsum(x[0, 1:] == 1, 0) % 2
    wrong = (answer != parity).nonzero()
    return int(wrong[0]) + 1 if len(wrong) else None


@contextmanager
def bias_removed(model):
    """The model without Selective RoPE's bias e^b, the angle every token adds whatever it is (RoPE's kind)."""
    pe = model.blocks[0].mixer.pe
    log_bias = pe.log_bias
    pe.log_bias = None
    try:
        yield model
    finally:
        pe.log_bias = log_bias


@contextmanager
def gate_scaled(model, head: int, pair: int, c: float):
    """The model with log alpha of `pair`'s two channels (i and i + D/2, GPT-NeoX halves) in `head` times c."""
    mixer = model.blocks[0].mixer
    recurrence = mixer.recurrence

    def scaled(fn, fn_rec, args, ctx):
        q, k, v, g, *rest = args
        g = g.clone()
        g[:, :, head, [pair, pair + g.shape[-1] // 2]] *= c
        return recurrence(fn, fn_rec, (q, k, v, g, *rest), ctx)
    mixer.recurrence = scaled
    try:
        yield model
    finally:
        del mixer.recurrence  # the class's again


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--examples", type=int, default=256, help="test sequences scored per gate setting")
    ap.add_argument("--top", type=int, default=5, help="pairs to list")
    args = ap.parse_args()
    model, _, ckpt = load_model(args.checkpoint)
    model = model.float()  # the angles and scores in fp32, whatever the run trained in
    cfg = dict(ckpt["config"]["data"])
    if cfg.get("name") != "state_tracking" or cfg.get("group", "S2") != "S2" or not cfg.get("bos", True):
        raise SystemExit(f"{args.checkpoint}: not an S2 run with <bos> (data={cfg.get('name')}, "
                         f"group={cfg.get('group')}, bos={cfg.get('bos')})")
    if not hasattr(model.blocks[0].mixer.pe, "increments") or not hasattr(model.blocks[0].mixer, "recurrence"):
        raise SystemExit(f"{args.checkpoint}: the probe reads a recurrent mixer with Selective RoPE")
    task = tasks.build({**cfg, "test_examples": args.examples, "train_examples": 1})
    bos = len(task.symbols) - 1
    pairs = parity_pairs(token_angles(model, [0, 1], bos))
    print(f"{args.checkpoint}: step {ckpt['step']}, {len(pairs)} rotary pairs; closest to the parity rule:")
    for r in pairs[:args.top]:
        print(f"  head {r['head']:2d} pair {r['pair']:2d}: a 0 adds {r['angle_0']:+.4f} rad, a 1 {r['angle_1']:+.4f}; "
              f"off by {r['err_0']:.4f} / {r['err_1']:.4f}: pi/2 after ~{r['length']:,.0f} tokens")
    runs = {t: first_wrong(model, t, bos, task.evals[0].length) for t in (0, 1)}
    print("runs of one token, first wrong position: " + ", ".join(f"all {t}s {runs[t] or 'none'}" for t in (0, 1)))
    pe = model.blocks[0].mixer.pe
    if pe.log_bias is not None:
        b = (pe.log_bias.exp() * pe.theta).detach()
        with bias_removed(model):
            out = tasks.evaluate(model, task, 64, "cpu")
        print(f"the bias turns each pair by {b.min():.2f}-{b.max():.2f} rad a token; without it: "
              f"up to {task.train_len} {out['val_acc']:.4f}, beyond {out.get('val_acc_extrap', math.nan):.4f}",
              flush=True)
    best = pairs[0]
    for c in (1.0, 0.5, 0.25, 0.0):
        with gate_scaled(model, best["head"], best["pair"], c):
            out = tasks.evaluate(model, task, 64, "cpu")
        curve = out["curve"]
        points = [n for n in (64, 128, 192, 256, 320, 384, 448, 512) if n in curve]
        print(f"log alpha x {c:<4} on head {best['head']} pair {best['pair']}: "
              + " ".join(f"{n}:{curve[n]:.3f}" for n in points)
              + f" | up to {task.train_len} {out['val_acc']:.4f}, beyond {out.get('val_acc_extrap', math.nan):.4f},"
              f" sequences right to {max(curve)} {out.get('val_seq_acc_extrap', math.nan):.3f}", flush=True)
        if c == 1.0:
            print(f"  the error beyond {task.train_len} recurs every " + ", ".join(
                f"{p:.2f} tokens ({share:.0%})" for p, share in error_periods(curve, task.train_len))
                + " (share of its variance)")


if __name__ == "__main__":
    main()
