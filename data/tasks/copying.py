"""`data=copying`: copy a random string after a <copy> token (Jelassi et al. 2024; seed 004, Table 6 and Figure 6).

    <bos> s_1 ... s_L <copy> s_1 ... s_L <eos> <pad> ...       s_i uniform over `vocab_size` letters

The model reads the sequence left to right (teacher forcing) and is scored from <copy> on: at <copy> it must
produce s_1, at s_i the next letter, at s_L <eos>. Training strings have lengths uniform in [min_len, max_len].

    packed: true   (the seed's code) examples back to back, seq_len + 1 tokens a row (420: 419 inputs), the last
                   one cut off and not scored; a fresh row for every sample (no example repeats), so the copy
                   starts at every position of the context
    packed: false  one string per row from position 0, padded to seq_len (>= 2 max_len + 2), train_examples fixed

Evaluation uses one string of each length in eval_lengths per row, from position 0, up to 512 and beyond the
training lengths (as the seed's code evaluates). An evaluation string counts as copied only if every scored token
is right, which under teacher forcing is exactly the string greedy decoding would produce.
"""

from __future__ import annotations

import string

import numpy as np

from duality.common.errors import ConfigError

from . import EvalSet, Examples, Stream, TaskData, compact, options, rng_for


def symbols(vocab_size: int) -> list[str]:
    letters = list(string.ascii_lowercase) if vocab_size <= 26 else [f"c{i}" for i in range(vocab_size)]
    return letters[:vocab_size] + ["<bos>", "<copy>", "<eos>", "<pad>"]


def _example(i, L, letter, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The token at place i of an example <bos> s_1..s_L <copy> s_1..s_L <eos> (<pad> after it), and whether it is
    scored (s_1..s_L and <eos> after <copy>). letter(j): the example's letter s_{j+1} (j may be out of range where
    the token is no letter)."""
    bos, copy, eos, pad = vocab_size, vocab_size + 1, vocab_size + 2, vocab_size + 3
    s = letter(np.where(i <= L, i - 1, i - L - 2))
    seq = np.where(i == 0, bos, np.where(i == L + 1, copy, np.where(i == 2 * L + 2, eos,
                                                                    np.where(i > 2 * L + 2, pad, s))))
    return seq, (i >= L + 2) & (i <= 2 * L + 2)


def generate(rng, lengths: np.ndarray, vocab_size: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """One example per entry of lengths, as inputs/targets of `width` tokens."""
    letters = rng.integers(0, vocab_size, size=(len(lengths), int(lengths.max())))
    pos = np.arange(width + 1)[None, :]  # the full sequence is width + 1 tokens: inputs = [:-1], targets = [1:]
    seq, scored = _example(pos, lengths[:, None], lambda j: np.take_along_axis(
        letters, j.clip(0, letters.shape[1] - 1), 1), vocab_size)
    return seq[:, :-1], np.where(scored[:, 1:], seq[:, 1:], -1)  # token t is the target at position t - 1


def packed(rngs: list, width: int, lo: int, hi: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """One packed row per rng: examples of lengths uniform in [lo, hi] back to back until width + 1 tokens (the
    inputs and the last target) are filled; the example cut off at the end is not scored. Built for the whole batch
    at once (a row at a time costs ~0.2 ms, a GPU step's worth at batch 256)."""
    m = (width + 1) // (2 * lo + 3) + 1  # lengths enough to overfill a row; (width + 1) // 2 letters, enough letters
    draws = [(r.integers(lo, hi + 1, size=m), r.integers(0, vocab_size, size=(width + 1) // 2)) for r in rngs]
    L, s = np.stack([d[0] for d in draws]), np.stack([d[1] for d in draws])
    ends = np.cumsum(2 * L + 3, 1)  # an example is 2L + 3 tokens: <bos> s <copy> s <eos>
    marks = np.zeros((len(rngs), width + 2), np.int64)
    r, c = np.nonzero(ends <= width + 1)
    marks[r, ends[r, c]] = 1
    ex = np.cumsum(marks[:, :-1], 1)  # [rows, width + 1]: the example each token belongs to
    at = lambda a: np.take_along_axis(a, ex, 1)  # noqa: E731  (per-example values, per token)
    off = at(np.cumsum(L, 1) - L)  # where each token's example has its letters in s
    seq, scored = _example(np.arange(width + 1)[None, :] - at(ends - (2 * L + 3)), at(L),
                           lambda j: np.take_along_axis(s, (off + j).clip(0, s.shape[1] - 1), 1), vocab_size)
    scored &= at(ends) <= width + 1  # the example cut off at the end: nothing scored
    return seq[:, :-1], np.where(scored[:, 1:], seq[:, 1:], -1)


def build(cfg: dict) -> TaskData:
    o = _defaults(**options(cfg, _defaults, "copying"))
    lo, hi, T = o["min_len"], o["max_len"], o["seq_len"]
    if not 1 <= lo <= hi:
        raise ConfigError(f"data=copying: need 1 <= min_len <= max_len, got {lo}, {hi}")
    if T < 2 * hi + 2:
        raise ConfigError(f"data=copying: seq_len={T} cannot hold a string of max_len={hi} twice; "
                          f"seq_len must be >= 2 max_len + 2 = {2 * hi + 2}")
    if o["packed"]:
        train = Stream(lambda rngs: packed(rngs, T, lo, hi, o["vocab_size"]), o["train_examples"], o["seed"])
    else:
        rng = rng_for(o["seed"], "train")
        x, y = generate(rng, rng.integers(lo, hi + 1, size=o["train_examples"]), o["vocab_size"], T)
        train = Examples(compact(x), compact(y), seed=o["seed"])
    evals = []
    for j, L in enumerate(o["eval_lengths"]):
        ex, ey = generate(rng_for(o["seed"], "test", j), np.full(o["test_examples"], L), o["vocab_size"], 2 * L + 2)
        evals.append(EvalSet(compact(ex), compact(ey), length=int(L), exact=True))
    return TaskData("copying", train, evals, symbols(o["vocab_size"]),
                    train_len=hi, seq_len=T, unit="string length")


def _defaults(*, vocab_size=26, min_len=2, max_len=64, seq_len=419, packed=True, train_examples=1_280_000,
              test_examples=64, eval_lengths=(8, 16, 32, 64, 96, 128, 192, 256, 384, 512), seed=0):
    return dict(locals())
