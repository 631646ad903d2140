"""Data sources by name (`conf/data/*.yaml`) -> token shards on disk (data/shards.py) + a tokenizer.

`prepare(cfg)` returns a DataInfo, doing the work once: the result lives in `<cache_dir>/<name>-<hash of the
config>/` and `meta.json`, written last and atomically, marks it complete. A source is a function returning a list
of documents; new sources (FineWeb, LongCrawl64, synthetic tasks) register here.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import embedded, text
from .shards import ShardError, TokenWindows, TrainBatches, write_shard
from .tokenizer import Tokenizer, make_tokenizer

__all__ = ["DataInfo", "prepare", "SOURCES", "ShardError", "TokenWindows", "TrainBatches", "Tokenizer"]

SOURCES = {
    "embedded": lambda cfg: embedded.documents(),
    "text": lambda cfg: text.documents(cfg.get("files"), cfg.get("format", "text"), cfg.get("text_field", "text"),
                                       cfg.get("sample_by", "document")),
}
# keys that name where or how the result is stored, not what it contains
_NOT_HASHED = {"cache_dir"}


@dataclass
class DataInfo:
    train_shards: list[str]
    val_shards: list[str]
    tokenizer: Tokenizer
    n_train_tokens: int
    n_val_tokens: int
    dir: str


def _key(cfg: dict) -> str:
    blob = json.dumps({k: v for k, v in sorted(cfg.items()) if k not in _NOT_HASHED}, sort_keys=True, default=str)
    if cfg.get("name") == "embedded":  # the corpus is the running Python's own stdlib
        blob += sys.version.split()[0]
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def _write_atomic(path: Path, text_: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text_)
    os.replace(tmp, path)


def _load(d: Path) -> DataInfo:
    meta = json.loads((d / "meta.json").read_text())
    tok = Tokenizer.from_dict(json.loads((d / "tokenizer.json").read_text()))
    return DataInfo([str(d / s) for s in meta["train"]], [str(d / s) for s in meta["val"]], tok,
                    meta["n_train_tokens"], meta["n_val_tokens"], str(d))


def _write_split(docs, tok: Tokenizer, d: Path, prefix: str, shard_tokens: int, progress: bool) -> tuple[list, int]:
    from tqdm import tqdm
    names, buf, n_buf, total = [], [], 0, 0
    dtype = np.uint16 if tok.vocab_size <= 2 ** 16 else np.uint32

    def flush():
        nonlocal buf, n_buf
        if n_buf:
            name = f"{prefix}_{len(names):05d}.bin"
            write_shard(d / name, np.concatenate(buf), tok.vocab_size)
            names.append(name)
            buf, n_buf = [], 0

    batch = 256
    for i in tqdm(range(0, len(docs), batch), desc=f"tokenizing {prefix}", disable=not progress, unit="batch"):
        for ids in tok.encode_batch(docs[i:i + batch]):
            ids = np.asarray(ids + [tok.eot_id], dtype=dtype)
            buf.append(ids)
            n_buf += len(ids)
            total += len(ids)
        if n_buf >= shard_tokens:
            flush()
    flush()
    return names, total


def prepare(cfg, progress: bool = True, tokenizer: Tokenizer | None = None) -> DataInfo:
    """Tokenize the source into shards once (cached). With `tokenizer`, use it instead of the configured one
    (evaluating a checkpoint on other data must use the checkpoint's tokenizer)."""
    cfg = dict(cfg)
    if tokenizer is not None:
        cfg["tokenizer"] = "given:" + hashlib.sha256(json.dumps(tokenizer.to_dict()).encode()).hexdigest()[:10]
    name = cfg.get("name")
    if name not in SOURCES:
        raise ValueError(f"unknown data={name!r}; valid choices: {sorted(SOURCES)}")
    d = Path(cfg.get("cache_dir") or "cache") / f"{name}-{_key(cfg)}"
    if (d / "meta.json").exists():
        return _load(d)
    d.mkdir(parents=True, exist_ok=True)
    docs = SOURCES[name](cfg)
    every = int(cfg.get("val_every", 20))  # every k-th document is held out
    val_docs = [x for i, x in enumerate(docs) if i % every == every - 1]
    train_docs = [x for i, x in enumerate(docs) if i % every != every - 1]
    if not train_docs or not val_docs:
        raise ShardError(f"data={name}: {len(docs)} documents are too few for a train/validation split "
                         f"(every {every}-th document is held out)")
    tok = tokenizer or make_tokenizer(cfg.get("tokenizer", "bpe"), train_docs, int(cfg.get("vocab_size", 4096)))
    shard_tokens = int(cfg.get("shard_tokens", 100_000_000))
    train, n_train = _write_split(train_docs, tok, d, "train", shard_tokens, progress)
    val, n_val = _write_split(val_docs, tok, d, "val", shard_tokens, progress)
    _write_atomic(d / "tokenizer.json", json.dumps(tok.to_dict()))
    meta = {"name": name, "train": train, "val": val, "n_train_tokens": n_train, "n_val_tokens": n_val,
            "n_docs": len(docs), "vocab_size": tok.vocab_size, "eot_id": tok.eot_id, "config": cfg}
    _write_atomic(d / "meta.json", json.dumps(meta, indent=1, default=str))
    return _load(d)
