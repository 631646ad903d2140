"""`data=parity|a3|s3`: the word problem of a permutation group (state tracking; seed 004 Table 5 and Figure 8,
after Merrill et al. 2024, Grazzi et al. 2025, Siems et al. 2025).

Tokens are the elements of G = S2 (parity), A3 (the 3 even permutations of 3 things: the cyclic group of order 3)
or S3 (all 6 permutations of 3 things: the smallest non-abelian group). Each input token x_t is uniform over G;
the target at every position is the running product

    s_t = x_t ∘ s_{t-1},  s_1 = x_1,     (p ∘ q)(i) = p(q(i))

so position t is scored on the prefix of length t: one pass over length-512 evaluation sequences gives accuracy
for every length up to 512 (train length 128 in the seed). For S2 this is the parity of the number of 1s.

`bos=true` (the default, as the seed's code and DeltaProduct's) puts a <bos> token before every sequence, not scored.
Without it a 1-layer model whose values depend on the current token alone (GLA without short convolutions) cannot
tell the prefix "1 1" from "1": every value in its state is v(1), so the per-head-normalised output has the same
direction, and it fails every (1, 1) prefix at length 2 (23.7% of the test set: the "0.763 at length 2" of runs
without BOS). The <bos> value in the state breaks the tie (tests/test_tasks.py).
"""

from __future__ import annotations

import itertools

import numpy as np

from duality.common.errors import ConfigError

from . import EvalSet, Examples, TaskData, compact, options, rng_for

GROUPS = ("S2", "A3", "S3")


def elements(group: str) -> list[tuple[int, ...]]:
    """The group's permutations in one-line notation, identity first (lexicographic order)."""
    n = int(group[1])
    perms = list(itertools.permutations(range(n)))
    if group[0] == "A":
        perms = [p for p in perms if _sign(p) == 1]
    return perms


def _sign(p) -> int:
    inversions = sum(1 for i in range(len(p)) for j in range(i + 1, len(p)) if p[i] > p[j])
    return -1 if inversions % 2 else 1


def table(group: str) -> np.ndarray:
    """mul[a, b] = index of elements[a] ∘ elements[b]."""
    el = elements(group)
    index = {p: i for i, p in enumerate(el)}
    return np.array([[index[tuple(a[b[i]] for i in range(len(a)))] for b in el] for a in el], dtype=np.int64)


def generate(rng, n: int, length: int, group: str, chunk: int = 65_536) -> tuple[np.ndarray, np.ndarray]:
    """n sequences of group elements x and their running products s, as int8. Drawn `chunk` rows at a time, the same
    numbers as one draw of all n rows (tested): one int64 draw of seed 004's 2M x 128 took 4 GB a job, six jobs of a
    sweep at once, and its build 38 s on a 2-core CPU, 21 s chunked."""
    mul = table(group)
    xs, ss = [], []
    for first in range(0, n, chunk):
        x = rng.integers(0, len(mul), size=(min(chunk, n - first), length))
        s = np.empty_like(x)
        s[:, 0] = x[:, 0]
        for t in range(1, length):
            s[:, t] = mul[x[:, t], s[:, t - 1]]
        xs.append(x.astype(np.int8))  # the groups have at most 6 elements
        ss.append(s.astype(np.int8))
    return (np.concatenate(xs), np.concatenate(ss)) if xs else (np.empty((0, length), np.int8),) * 2


def build(cfg: dict) -> TaskData:
    o = _defaults(**options(cfg, _defaults, "state_tracking"))
    if o["group"] not in GROUPS:
        raise ConfigError(f"data.group={o['group']!r}; valid choices: {list(GROUPS)}")
    if not 1 <= o["seq_len"] <= o["eval_len"]:
        raise ConfigError(f"data: need 1 <= seq_len <= eval_len, got {o['seq_len']}, {o['eval_len']}")
    x, y = generate(rng_for(o["seed"], "train"), o["train_examples"], o["seq_len"], o["group"])
    ex, ey = generate(rng_for(o["seed"], "test"), o["test_examples"], o["eval_len"], o["group"])
    names = ["".join(map(str, p)) for p in elements(o["group"])]
    if o["bos"]:
        (x, y), (ex, ey) = with_bos(x, y, len(names)), with_bos(ex, ey, len(names))
        names.append("<bos>")
    first = int(o["bos"])
    return TaskData(o["group"].lower(), Examples(compact(x), compact(y), seed=o["seed"]),
                    [EvalSet(compact(ex), compact(ey), length=o["eval_len"], per_position=True, first=first)], names,
                    train_len=o["seq_len"], seq_len=o["seq_len"] + first)


def with_bos(x: np.ndarray, s: np.ndarray, bos: int) -> tuple[np.ndarray, np.ndarray]:
    """<bos> x_1 .. x_T with targets -1 s_1 .. s_T (the <bos> position is not scored)."""
    n = len(x)
    return (np.concatenate([np.full((n, 1), bos, x.dtype), x], 1),
            np.concatenate([np.full((n, 1), -1, s.dtype), s], 1))


def _defaults(*, group="S2", seq_len=128, eval_len=512, train_examples=2_000_000, test_examples=2_000, seed=0,
              bos=True):
    return dict(locals())
