"""Token shards and the loader that reads them.

Shard file (little endian):
    bytes 0..7    magic b"DUALTOK\\0"
    4 bytes       format version (1)
    4 bytes       bytes per token: 2 (uint16) or 4 (uint32)
    8 bytes       number of tokens
    8 bytes       vocabulary size of the tokenizer that wrote it
    ...           zero padding up to HEADER_BYTES (64)
    tokens        memory-mapped by the loader
Documents are joined with one end-of-text token after each (it also serves as BOS of the next document).
Shards are written to a temporary name, flushed, fsynced and renamed: a reader never sees half a shard.

Loader: a shard of n tokens holds (n - 1) // T windows of T + 1 tokens (input + shifted target) at stride T. The
windows of all shards form one list, shuffled by a permutation that depends only on (seed, epoch). Global sample g
(g = step * samples_per_step + i) is window perm_{g // N}[g % N]. A batch is therefore a pure function of the step:
resuming needs only the step number, and any world size sees the same global batch (each rank takes a slice).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import torch

from duality.common.errors import ShardError
from duality.common.io import atomic_open

MAGIC = b"DUALTOK\0"
VERSION = 1
HEADER_BYTES = 64
_HEADER = struct.Struct("<8sIIQQ")


def write_shard(path: str | Path, tokens: np.ndarray, vocab_size: int) -> None:
    """Write tokens atomically: to `path.tmp`, fsync, then rename over `path`."""
    path = Path(path)
    dtype = np.uint16 if vocab_size <= 2 ** 16 else np.uint32
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ShardError(f"{path}: token ids must lie in [0, {vocab_size}), got [{tokens.min()}, {tokens.max()}]")
    header = _HEADER.pack(MAGIC, VERSION, np.dtype(dtype).itemsize, tokens.size, vocab_size).ljust(HEADER_BYTES, b"\0")
    with atomic_open(path, "wb") as f:
        f.write(header)
        f.write(tokens.astype(dtype).tobytes())


def read_header(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ShardError(f"shard {path} does not exist (prepare the data first; see docs/data.md)")
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES or raw[:8] != MAGIC:
        raise ShardError(f"{path} is not a token shard (bad magic); re-run the data preparation")
    magic, version, itemsize, n, vocab = _HEADER.unpack(raw[:_HEADER.size])
    if version != VERSION or itemsize not in (2, 4):
        raise ShardError(f"{path}: unsupported shard version {version} / token size {itemsize}")
    if size != HEADER_BYTES + n * itemsize:
        raise ShardError(f"{path} is truncated: header says {n} tokens ({HEADER_BYTES + n * itemsize} bytes), "
                         f"file has {size} bytes; delete it and re-run the data preparation")
    return {"n_tokens": n, "vocab_size": vocab, "dtype": np.uint16 if itemsize == 2 else np.uint32}


def read_shard(path: str | Path) -> np.ndarray:
    h = read_header(path)
    return np.memmap(path, dtype=h["dtype"], mode="r", offset=HEADER_BYTES, shape=(h["n_tokens"],))


class EpochOrder:
    """Global sample g -> item g % n of epoch g // n's permutation, drawn from (seed, epoch) alone."""

    def __init__(self, n: int, seed: int = 0, shuffle: bool = True):
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self._epoch, self._perm = None, None

    def __call__(self, g: int) -> int:
        epoch, i = divmod(g, self.n)
        if not self.shuffle:
            return i
        if self._epoch != epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            self._epoch = epoch
        return int(self._perm[i])


class TokenWindows:
    """Fixed-length windows of seq_len + 1 tokens over a list of shards, in a seeded order per epoch."""

    def __init__(self, paths, seq_len: int, vocab_size: int | None = None, seed: int = 0, shuffle: bool = True):
        if not paths:
            raise ShardError("no shards given")
        self.seq_len = seq_len
        self.shards, starts = [], []
        for i, p in enumerate(paths):
            h = read_header(p)
            if vocab_size is not None and h["vocab_size"] != vocab_size:
                raise ShardError(f"{p} was written for a vocabulary of {h['vocab_size']} tokens, the model has "
                                 f"{vocab_size}: re-tokenize the data with the model's tokenizer")
            self.shards.append(read_shard(p))
            n_win = (h["n_tokens"] - 1) // seq_len
            starts.append(np.stack([np.full(n_win, i), np.arange(n_win) * seq_len], 1))
        self.index = np.concatenate(starts).astype(np.int64)
        if len(self.index) == 0:
            total = sum(len(s) for s in self.shards)
            raise ShardError(f"{total} tokens in {len(paths)} shard(s) do not fill one window of {seq_len + 1} "
                             "tokens: lower model.seq_len or add data")
        self.order = EpochOrder(len(self.index), seed, shuffle)

    def __len__(self):
        return len(self.index)

    def window(self, g: int) -> np.ndarray:
        """The window of global sample g (cycles through epochs, reshuffled each epoch)."""
        shard, start = self.index[self.order(g)]
        return np.asarray(self.shards[shard][start:start + self.seq_len + 1], dtype=np.int64)

    def batch(self, sample_ids) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.from_numpy(np.stack([self.window(int(g)) for g in sample_ids]))
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def pack_documents(x: torch.Tensor, y: torch.Tensor, eot: int):
    """Windows [B, T] -> one packed row [1, B T] and its document boundaries cu_seqlens [N + 1] (int64): a document
    starts at each window's first token and at each end-of-text token, the BOS of the document after it. The model
    then keeps every document to itself (train.doc_boundaries; model/gpt.py)."""
    B, T = x.shape
    flat = x.reshape(-1)
    starts = torch.cat([torch.arange(0, B * T + 1, T), (flat == eot).nonzero()[:, 0]])
    return flat[None], y.reshape(1, -1), torch.unique(starts, sorted=True)


def rank_batches(n: int, rank: int, world: int, rows: int) -> list[list[int]]:
    """Items rank, rank + world, ... of range(n) in batches of at most `rows`, and empty batches after them so that
    every rank gets as many batches as the busiest one: under FSDP2 each forward gathers parameters with every
    rank, so a rank that ran out of evaluation examples must still run a forward (on any input, its result not
    counted) for each forward the others run."""
    ids = list(range(n))[rank::world]
    busiest = -(-n // world)  # items on rank 0, the busiest
    batches = [ids[i:i + rows] for i in range(0, len(ids), rows)]
    return batches + [[] for _ in range(-(-busiest // rows) - len(batches))]


class TrainBatches:
    """Micro-batches of one rank. Step s, micro-step m, rank r of world w reads global samples
    s*G + (m*w + r)*b + [0, b), with G = accum * w * b the global batch in sequences."""

    def __init__(self, windows: TokenWindows, micro_batch: int, accum: int, rank: int = 0, world: int = 1):
        self.windows, self.b, self.accum, self.rank, self.world = windows, micro_batch, accum, rank, world
        self.global_batch = micro_batch * accum * world

    def get(self, step: int, micro: int):
        start = step * self.global_batch + (micro * self.world + self.rank) * self.b
        return self.windows.batch(range(start, start + self.b))
