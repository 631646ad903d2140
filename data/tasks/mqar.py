"""`data=mqar`: multi-query associative recall, the Zoology protocol (Arora et al. 2024).

An example of length T with K pairs over a vocabulary of V tokens:

    k_1 v_1 k_2 v_2 ... k_K v_K | q . q . . . q . .        keys k in [1, V/2), values v in [V/2, V),
                                                             distinct within the example
The second part (T - 2K tokens) holds every key once more, in random order, at even offsets 2g, the gaps g drawn
without replacement from P(g) ∝ a g^(a-1) on 1..(T-2K)/2 (a = power_a: small a puts queries close to the start).
The target at a query's position is its key's value; no other position has a loss. The rest of the second part
is token 0 (or uniform random tokens with random_non_queries). Accuracy is over query positions.
"""

from __future__ import annotations

import numpy as np

from duality.common.errors import ConfigError

from . import EvalSet, Examples, TaskData, compact, options, rng_for


def distinct(rng: np.random.Generator, n: int, k: int, low: int, high: int) -> np.ndarray:
    """[n, k] integers from [low, high), distinct within each row (rejection: k is much smaller than high - low)."""
    out = rng.integers(low, high, size=(n, k))
    while True:
        s = np.sort(out, axis=1)
        bad = (s[:, 1:] == s[:, :-1]).any(axis=1)
        if not bad.any():
            return out
        out[bad] = rng.integers(low, high, size=(int(bad.sum()), k))


def generate(rng, n: int, seq_len: int, num_kv_pairs: int, vocab_size: int, power_a: float,
             random_non_queries: bool) -> tuple[np.ndarray, np.ndarray]:
    K, T, V = num_kv_pairs, seq_len, vocab_size
    ctx = 2 * K
    keys = distinct(rng, n, K, 1, V // 2)
    values = distinct(rng, n, K, V // 2, V)
    space = (T - ctx) // 2
    logp = np.log(power_a) + (power_a - 1) * np.log(np.arange(1, space + 1))
    # K gaps without replacement from P(g): the top K of log p + Gumbel noise (the Gumbel-top-k trick)
    gaps = np.argsort(-(logp + rng.gumbel(size=(n, space))), axis=1)[:, :K]
    inputs = np.zeros((n, T), dtype=np.int64)
    inputs[:, 0:ctx:2], inputs[:, 1:ctx:2] = keys, values
    rows = np.arange(n)[:, None]
    query_pos = ctx + 2 * gaps
    if random_non_queries:
        filler = rng.integers(0, V, size=(n, T - ctx))
        inputs[:, ctx:] = filler
    inputs[rows, query_pos] = keys
    targets = np.full((n, T), -1, dtype=np.int64)
    targets[rows, query_pos] = values
    return inputs, targets


def build(cfg: dict) -> TaskData:
    o = _defaults(**options(cfg, _defaults, "mqar"))
    if o["num_kv_pairs"] is None:  # Zoology's grid: (64, 4), (128, 8), (256, 16)
        o["num_kv_pairs"] = o["seq_len"] // 16
    checks = [(o["seq_len"], o["num_kv_pairs"])] + [tuple(t) for t in o["test"]]
    for T, K in checks:
        if T % 2 or 4 * K > T:
            raise ConfigError(f"data=mqar: (seq_len, num_kv_pairs) = ({T}, {K}) needs an even seq_len >= 4 x pairs")
        if K >= o["vocab_size"] // 2 - 1:
            raise ConfigError(f"data=mqar: {K} distinct keys do not fit in vocab_size/2 = {o['vocab_size'] // 2}")
    gen = dict(vocab_size=o["vocab_size"], power_a=o["power_a"], random_non_queries=o["random_non_queries"])
    x, y = generate(rng_for(o["seed"], "train"), o["train_examples"], o["seq_len"], o["num_kv_pairs"], **gen)
    evals = []
    for j, (T, K) in enumerate(tuple(t) for t in (o["test"] or [[o["seq_len"], o["num_kv_pairs"]]])):
        ex, ey = generate(rng_for(o["seed"], "test", j), o["test_examples"], T, K, **gen)
        evals.append(EvalSet(compact(ex), compact(ey), length=T))
    return TaskData("mqar", Examples(compact(x), compact(y), seed=o["seed"]), evals,
                    symbols=[str(i) for i in range(o["vocab_size"])], train_len=o["seq_len"], seq_len=o["seq_len"],
                    info={"num_kv_pairs": o["num_kv_pairs"]})


def _defaults(*, vocab_size=8192, seq_len=256, num_kv_pairs=16, power_a=0.01, random_non_queries=False,
              train_examples=100_000, test_examples=3_000, test=(), seed=0):
    return dict(locals())
