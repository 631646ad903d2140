"""`data=copying`: copy a random string after a <copy> token (Jelassi et al. 2024; seed 004, Table 6 and Figure 6).

    <bos> s_1 ... s_L <copy> s_1 ... s_L <eos> <pad> ...       s_i uniform over `vocab_size` letters

The model reads the sequence left to right (teacher forcing) and is scored from <copy> on: at <copy> it must
produce s_1, at s_i the next letter, at s_L <eos>. Training strings have lengths uniform in [min_len, max_len],
padded to seq_len (>= 2 max_len + 2); evaluation uses strings of each length in eval_lengths, up to 512 and beyond
the training lengths. An evaluation string counts as copied only if every scored token is right, which under
teacher forcing is exactly the string greedy decoding would produce.
"""

from __future__ import annotations

import string

import numpy as np

from duality.common.errors import ConfigError

from . import EvalSet, Examples, TaskData, compact, options, rng_for


def symbols(vocab_size: int) -> list[str]:
    letters = list(string.ascii_lowercase) if vocab_size <= 26 else [f"c{i}" for i in range(vocab_size)]
    return letters[:vocab_size] + ["<bos>", "<copy>", "<eos>", "<pad>"]


def generate(rng, lengths: np.ndarray, vocab_size: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """One example per entry of lengths, as inputs/targets of `width` tokens."""
    n, V = len(lengths), vocab_size
    bos, copy, eos, pad = V, V + 1, V + 2, V + 3
    L = lengths[:, None]
    pos = np.arange(width + 1)[None, :]  # the full sequence is width + 1 tokens: inputs = [:-1], targets = [1:]
    letters = rng.integers(0, V, size=(n, int(lengths.max())))
    first = np.take_along_axis(letters, np.clip(pos - 1, 0, letters.shape[1] - 1), 1)  # s_i at 1 + i
    second = np.take_along_axis(letters, np.clip(pos - L - 2, 0, letters.shape[1] - 1), 1)  # at L + 2 + i
    seq = np.where(pos == 0, bos, np.where(pos <= L, first, np.where(pos == L + 1, copy,
                   np.where(pos <= 2 * L + 1, second, np.where(pos == 2 * L + 2, eos, pad)))))
    scored = (pos[:, 1:] >= L + 2) & (pos[:, 1:] <= 2 * L + 2)  # targets s_1 .. s_L, <eos>
    return seq[:, :-1], np.where(scored, seq[:, 1:], -1)


def build(cfg: dict) -> TaskData:
    o = _defaults(**options(cfg, _defaults, "copying"))
    lo, hi, T = o["min_len"], o["max_len"], o["seq_len"]
    if not 1 <= lo <= hi:
        raise ConfigError(f"data=copying: need 1 <= min_len <= max_len, got {lo}, {hi}")
    if T < 2 * hi + 2:
        raise ConfigError(f"data=copying: seq_len={T} cannot hold a string of max_len={hi} twice; "
                          f"seq_len must be >= 2 max_len + 2 = {2 * hi + 2}")
    rng = rng_for(o["seed"], "train")
    x, y = generate(rng, rng.integers(lo, hi + 1, size=o["train_examples"]), o["vocab_size"], T)
    evals = []
    for j, L in enumerate(o["eval_lengths"]):
        ex, ey = generate(rng_for(o["seed"], "test", j), np.full(o["test_examples"], L), o["vocab_size"], 2 * L + 2)
        evals.append(EvalSet(compact(ex), compact(ey), length=int(L), exact=True))
    return TaskData("copying", Examples(compact(x), compact(y), seed=o["seed"]), evals, symbols(o["vocab_size"]),
                    train_len=hi, seq_len=T, unit="string length")


def _defaults(*, vocab_size=26, min_len=2, max_len=64, seq_len=130, train_examples=100_000, test_examples=64,
              eval_lengths=(8, 16, 32, 64, 96, 128, 192, 256, 384, 512), seed=0):
    return dict(locals())
