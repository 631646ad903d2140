"""`data=mad_<task>`: the six tasks of MAD (Poli et al. 2024, "Mechanistic Architecture Design"), generated from
data.seed with MAD's baseline settings (conf/data/mad_*.yaml) and its difficulty knobs as options.

Vocabulary layout (V = vocab_size, N = noise_vocab_size): ordinary tokens [0, V - N - s), noise tokens after them,
then s special tokens at the top (pad / <copy> / <blank> / <compress> / <insert>, as each task needs). Keys come
from the lower half of the ordinary tokens and values from the upper half.

in_context_recall  k v k v ... pairs; a key keeps its value within an example. Scored (test): each value whose
                   key appeared before, and the final probe pair's value. Training uses the next-token loss
                   everywhere, as MAD does.
noisy_in_context_recall   the same with each pair slot replaced by two noise tokens with probability frac_noise.
fuzzy_in_context_recall   keys and values are motifs of 1..k_motif_size / 1..v_motif_size distinct tokens (test
                   keys always k_motif_size long); one probe pair is planted at a random place and asked at the end.
selective_copying  num_tokens_to_copy tokens scattered among <blank>s, then <copy> and num_tokens_to_copy blanks at
                   which the tokens must be produced in order (targets are not fed back).
compression        seq_len - 1 random tokens and <compress>; the whole sequence must be decoded from the model's
                   last state alone (model.head=compress: MAD's auto-encoder decoder).
memorization       key <insert> pairs with a key -> value map fixed across the dataset (drawn from data.seed):
                   the values never appear in the input; the model must store the map in its weights.
"""

from __future__ import annotations

import random

import numpy as np

from duality.common.errors import ConfigError

from . import EvalSet, Examples, TaskData, compact, options, rng_for

TASKS = ("in_context_recall", "noisy_in_context_recall", "fuzzy_in_context_recall", "selective_copying",
         "compression", "memorization")


# ---------------------------------------------------------------------------------------------------- recall
def recall(r, *, vocab_size, seq_len, noise_vocab_size=0, frac_noise=0.0, multi_query=True, **_):
    """(sequence, scored targets) of one in-context recall example; the sequence has seq_len tokens."""
    special = 0 if multi_query else 1
    ns = vocab_size - noise_vocab_size - special
    copy_token = vocab_size - 1
    half = ns // 2
    slots = seq_len // 2 - 1  # + the probe pair (+ <copy>): seq_len (+ 1) tokens, as in MAD
    keep = r.randrange(slots)  # at least one real pair
    seq, tgt, kv = [], [], {}
    for i in range(slots):
        if frac_noise > 0 and i != keep and r.random() < frac_noise:
            seq += [r.randrange(ns, ns + noise_vocab_size) for _ in range(2)]
            tgt += [-1, -1]
            continue
        k = r.randrange(half)
        seen = k in kv
        if not seen:
            kv[k] = r.randrange(half, ns)
        seq += [k, kv[k]]
        tgt += [-1, kv[k] if seen and multi_query else -1]
    k = r.choice(sorted(kv))
    seq += ([copy_token] if not multi_query else []) + [k, kv[k]]
    tgt += ([-1] if not multi_query else []) + [-1, kv[k]]
    return seq, tgt


def fuzzy_recall(r, *, vocab_size, seq_len, k_motif_size=3, v_motif_size=3, noise_vocab_size=0, frac_noise=0.0,
                 multi_query=True, test=False, **_):
    special = 1 if multi_query else 2  # pad (and <copy>)
    ns = vocab_size - noise_vocab_size - special
    pad, copy_token = vocab_size - 1 if multi_query else vocab_size - 2, vocab_size - 1
    half = ns // 2

    def motif(lo, hi, size):  # an ordered tuple of distinct tokens
        return tuple(r.sample(range(lo, hi), size))

    def key_size():
        return k_motif_size if test else r.randint(1, k_motif_size)

    k_probe, v_probe = motif(0, half, key_size()), motif(half, ns, r.randint(1, v_motif_size))
    probe_len = len(k_probe) + len(v_probe)
    probe_at = r.randrange(seq_len - 2 * probe_len)
    seq, tgt, kv, planted = [], [], {}, False
    end = seq_len - probe_len - (k_motif_size + v_motif_size)
    while len(seq) < end:
        # plant the probe pair at probe_at, or in the last round at the latest (MAD's loop can end first)
        if (len(seq) >= probe_at or len(seq) + k_motif_size + v_motif_size >= end) and not planted:
            seq += [*k_probe, *v_probe]
            tgt += [-1] * probe_len
            kv[k_probe], planted = v_probe, True
            continue
        ks, vs = key_size(), r.randint(1, v_motif_size)
        if frac_noise > 0 and r.random() < frac_noise:
            seq += [r.randrange(ns, ns + noise_vocab_size) for _ in range(ks + vs)]
            tgt += [-1] * (ks + vs)
            continue
        k = motif(0, half, ks)
        seen = k in kv
        if k == k_probe:
            planted = True
        if not seen:
            kv[k] = v_probe if k == k_probe else motif(half, ns, vs)
        seq += [*k, *kv[k]]
        tgt += [-1] * ks + (list(kv[k]) if seen and multi_query else [-1] * len(kv[k]))
    seq += ([copy_token] if not multi_query else []) + [*k_probe, *v_probe]
    tgt += ([-1] if not multi_query else []) + [-1] * len(k_probe) + list(v_probe)
    n_pad = seq_len - len(seq)
    return [pad] * n_pad + seq, [-1] * n_pad + tgt


def _recall_task(make, rng, n, cfg, test):
    r = random.Random(int(rng.integers(2 ** 63)))  # per-token draws: Python's generator is ~10x cheaper per call
    rows = [make(r, test=test, **cfg) for _ in range(n)]
    seq, tgt = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    # next-token prediction: inputs seq[:-1]; training scores every next token, testing only the recalled values
    return seq[:, :-1], (tgt[:, 1:] if test else seq[:, 1:])


# -------------------------------------------------------------------------------------------- the other three
def selective_copying(rng, n, *, vocab_size, seq_len, num_tokens_to_copy, **_):
    copy_token, blank, ns = vocab_size - 1, vocab_size - 2, vocab_size - 2
    m = num_tokens_to_copy
    width = seq_len - m - 1  # the scattered part: m tokens among blanks
    x = np.full((n, seq_len), blank, dtype=np.int64)
    y = np.full((n, seq_len), -1, dtype=np.int64)
    for i in range(n):
        tokens = rng.integers(0, ns, size=m)
        x[i, np.sort(rng.choice(width, size=m, replace=False))] = tokens
        y[i, seq_len - m:] = tokens
    x[:, width] = copy_token
    return x, y


def compression(rng, n, *, vocab_size, seq_len, noise_vocab_size=0, frac_noise=0.0, **_):
    ns = vocab_size - 1 - noise_vocab_size
    x = rng.integers(0, ns, size=(n, seq_len))
    x[:, -1] = vocab_size - 1  # <compress>
    y = x.copy()
    if frac_noise > 0:
        noisy = rng.random((n, seq_len)) < frac_noise
        noisy[:, -1] = False
        x[noisy] = rng.integers(ns, ns + noise_vocab_size, size=int(noisy.sum()))
        y[noisy] = -1  # noise is not reconstructed
    return x, y


def memory_map(seed: int, vocab_size: int, noise_vocab_size: int) -> np.ndarray:
    """value_of[key] for keys [0, ns/2): a random matching onto the values [ns/2, ns), fixed by the data seed."""
    ns = vocab_size - 1 - noise_vocab_size
    rng = rng_for(seed, "map")
    return rng.permutation(np.arange(ns // 2, ns))[:ns // 2]


def memorization(rng, n, *, vocab_size, seq_len, value_of, noise_vocab_size=0, frac_noise=0.0, **_):
    ns = vocab_size - 1 - noise_vocab_size
    keys = rng.integers(0, len(value_of), size=(n, seq_len // 2))
    x = np.stack([keys, np.full_like(keys, vocab_size - 1)], 2).reshape(n, -1)  # key <insert> key <insert> ...
    y = np.stack([np.full_like(keys, -1), value_of[keys]], 2).reshape(n, -1)
    if frac_noise > 0:
        noisy = rng.random(keys.shape) < frac_noise
        noise = rng.integers(ns, ns + noise_vocab_size, size=(n, seq_len // 2, 2)).reshape(n, -1)
        cover = np.repeat(noisy, 2, axis=1)
        x, y = np.where(cover, noise, x), np.where(cover, -1, y)
    return x, y


# ------------------------------------------------------------------------------------------------------ build
def _symbols(task: str, V: int) -> list[str]:
    top = {"in_context_recall": [], "noisy_in_context_recall": [], "fuzzy_in_context_recall": ["<pad>"],
           "selective_copying": ["<blank>", "<copy>"], "compression": ["<compress>"], "memorization": ["<insert>"]}
    special = top[task]
    return [str(i) for i in range(V - len(special))] + special


def build(cfg: dict) -> TaskData:
    o = _defaults(**options(cfg, _defaults, "mad"))
    task, V, T = o["task"], o["vocab_size"], o["seq_len"]
    if task not in TASKS:
        raise ConfigError(f"data.task={task!r}; valid MAD tasks: {list(TASKS)}")
    if o["frac_noise"] > 0 and o["noise_vocab_size"] < 1:
        raise ConfigError("data.frac_noise > 0 needs data.noise_vocab_size >= 1")
    if T % 2:
        raise ConfigError(f"data.seq_len={T} must be even (MAD's tasks are built from pairs)")
    if task == "selective_copying" and T <= 2 * o["num_tokens_to_copy"] + 1:
        raise ConfigError(f"data: seq_len={T} must exceed 2 x num_tokens_to_copy + 1 = "
                          f"{2 * o['num_tokens_to_copy'] + 1}")
    gen = {k: o[k] for k in ("vocab_size", "seq_len", "noise_vocab_size", "frac_noise", "multi_query",
                             "k_motif_size", "v_motif_size", "num_tokens_to_copy")}
    if task == "memorization":
        gen["value_of"] = memory_map(o["seed"], V, o["noise_vocab_size"])

    def make(split, n):
        rng = rng_for(o["seed"], split)
        if task in ("in_context_recall", "noisy_in_context_recall"):
            return _recall_task(recall, rng, n, gen, test=split == "test")
        if task == "fuzzy_in_context_recall":
            return _recall_task(fuzzy_recall, rng, n, gen, test=split == "test")
        return {"selective_copying": selective_copying, "compression": compression,
                "memorization": memorization}[task](rng, n, **gen)

    x, y = make("train", o["train_examples"])
    ex, ey = make("test", o["test_examples"])
    return TaskData(f"mad_{task}", Examples(compact(x), compact(y), seed=o["seed"]),
                    [EvalSet(compact(ex), compact(ey), length=x.shape[1])], _symbols(task, V),
                    train_len=x.shape[1], seq_len=x.shape[1], head="compress" if task == "compression" else "lm")


def _defaults(*, task="in_context_recall", vocab_size=16, seq_len=128, train_examples=12_800, test_examples=1_280,
              frac_noise=0.0, noise_vocab_size=0, num_tokens_to_copy=0, k_motif_size=1, v_motif_size=1,
              multi_query=True, seed=0):
    return dict(locals())
