"""Data sources by name (`conf/data/*.yaml`) -> token shards on disk (data/shards.py) + a tokenizer.

`prepare(cfg)` returns a DataInfo, doing the work once: the result lives in `<cache_dir>/<name>-<hash of the
config>/` and `meta.json`, written last and atomically, marks it complete. A source is a function returning an
iterable of documents (a list, or a stream such as FineWeb's); new sources register in SOURCES. A source that is
already tokenized on disk (LongCrawl64) registers in ARRAYS instead and skips the shards.

Writing is resumable: shards are written atomically as the stream goes, and `progress.json` (also atomic) records
how many documents the written shards hold; an interrupted `prepare` continues from there. Document i is held out
for validation when i % val_every == val_every - 1. Tokenization runs in `workers` processes (order preserved).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from duality.common.io import write_atomic

from . import embedded, fineweb, longcrawl64, text
from .shards import ShardError, TokenWindows, TrainBatches, pack_documents, rank_batches, write_shard
from .tokenizer import Tokenizer, make_tokenizer

__all__ = ["DataInfo", "prepare", "SOURCES", "ShardError", "TokenWindows", "TrainBatches", "Tokenizer",
           "pack_documents", "rank_batches"]

SOURCES = {
    "embedded": lambda cfg: embedded.documents(),
    "text": lambda cfg: text.documents(cfg.get("files"), cfg.get("format", "auto"), cfg.get("text_field", "text"),
                                       cfg.get("sample_by", "document")),
    "fineweb": fineweb.documents,
    "fineweb_edu": fineweb.documents,
}
ARRAYS = {"longcrawl64": longcrawl64.open_arrays}
# sources read from local files that a user may edit: the cache remembers their (path, size, mtime) and is prepared
# again when they change (its key is the config, which names the files but not their contents)
def _local_files(cfg):
    return text.fingerprint(cfg["files"]) if cfg.get("files") else None  # FineWeb from the hub: none


FINGERPRINTS = {"text": _local_files, "fineweb": _local_files, "fineweb_edu": _local_files}
# keys that name where or how the result is stored or computed, not what it contains
_NOT_HASHED = {"cache_dir", "workers"}


@dataclass
class DataInfo:
    train_shards: list[str]
    val_shards: list[str]
    tokenizer: Tokenizer
    n_train_tokens: int
    n_val_tokens: int
    dir: str
    arrays: dict = field(default_factory=dict)  # an ARRAYS source: split -> [documents, doc_len] token array

    def windows(self, split: str, seq_len: int, seed: int = 0, shuffle: bool = True):
        """The windows of seq_len + 1 tokens of a split ('train' or 'val') that the loader batches."""
        if self.arrays:
            return longcrawl64.DocWindows(self.arrays[split], seq_len, self.tokenizer.eot_id, seed, shuffle,
                                          name=f"{self.dir} ({split})")
        try:
            return TokenWindows(self.train_shards if split == "train" else self.val_shards, seq_len,
                                self.tokenizer.vocab_size, seed=seed, shuffle=shuffle)
        except ShardError as e:
            if split != "val" or "do not fill one window" not in str(e):
                raise
            # the held-out documents alone are too short: the knob is how many are held out, not only the context
            raise ShardError(f"the validation split ({self.n_val_tokens:,} tokens, every data.val_every-th document "
                             f"of {self.dir}) does not fill one window of {seq_len + 1} tokens: hold out more "
                             "documents (a smaller data.val_every, then prepare again), add data, or lower "
                             "model.seq_len") from None


def _key(cfg: dict) -> str:
    blob = json.dumps({k: v for k, v in sorted(cfg.items()) if k not in _NOT_HASHED}, sort_keys=True, default=str)
    if cfg.get("name") == "embedded":  # the corpus is the running Python's own stdlib
        blob += sys.version.split()[0]
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def _changes(then: list | None, now: list) -> str:
    if then is None:
        return "no record of its source files"
    a, b = {f[0]: f[1:] for f in then}, {f[0]: f[1:] for f in now}
    parts = [f"{len(set(b) - set(a))} added", f"{len(set(a) - set(b))} removed",
             f"{sum(a[f] != b[f] for f in set(a) & set(b))} changed"]
    return "source files " + ", ".join(x for x in parts if not x.startswith("0 "))


def _read_json(path: Path):
    """A data cache's JSON file, or a ShardError that names it and the way out (it was damaged after prepare()
    wrote it: each is written atomically)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ShardError(f"{path} is unreadable ({type(e).__name__}: {str(e)[:100]}): the data cache is damaged; "
                         f"delete {path.parent} and it is prepared again") from None


def open_prepared(d: Path) -> DataInfo:
    """A folder that prepare() wrote (its meta.json, tokenizer.json and shards), as prepare() returns it."""
    d = Path(d)
    meta = _read_json(d / "meta.json")
    tok = Tokenizer.from_dict(_read_json(d / "tokenizer.json"))
    try:
        return DataInfo([str(d / s) for s in meta["train"]], [str(d / s) for s in meta["val"]], tok,
                        meta["n_train_tokens"], meta["n_val_tokens"], str(d))
    except (KeyError, TypeError) as e:
        raise ShardError(f"{d / 'meta.json'} is not what prepare() writes (no {e}): the data cache is damaged; "
                         f"delete {d} and it is prepared again") from None


# ---------------------------------------------------------------------------------- tokenization (worker processes)
_worker_tok: Tokenizer | None = None


def _init_worker(tok_dict: dict) -> None:
    global _worker_tok
    _worker_tok = Tokenizer.from_dict(tok_dict)


def _encode(docs: list[str]) -> list[np.ndarray]:
    """Each document's tokens followed by one end-of-text token."""
    tok = _worker_tok
    dtype = np.uint16 if tok.vocab_size <= 2 ** 16 else np.uint32
    return [np.asarray(ids + [tok.eot_id], dtype=dtype) for ids in tok.encode_batch(docs)]


def _batched(it, n: int):
    it = iter(it)
    while batch := list(itertools.islice(it, n)):
        yield batch


def _tokenized(docs, tok: Tokenizer, workers: int, batch: int = 256):
    """Token arrays of the documents, in order: in this process, or in `workers` processes."""
    if workers <= 1:
        _init_worker(tok.to_dict())
        for b in _batched(docs, batch):
            yield from _encode(b)
        return
    import multiprocessing as mp
    # spawn: a forked child would inherit the Rust tokenizer's thread pool in an undefined state
    with mp.get_context("spawn").Pool(workers, _init_worker, (tok.to_dict(),)) as pool:
        for arrays in pool.imap(_encode, _batched(docs, batch), chunksize=1):
            yield from arrays


def write_shards(docs, tok: Tokenizer, d: Path, val_every: int, shard_tokens: int, workers: int = 1,
                 progress: bool = True, total: int | None = None) -> dict:
    """Tokenize a stream of documents into train_XXXXX.bin / val_XXXXX.bin shards in d, resuming from
    d/progress.json. Each split's buffer is flushed whenever the train buffer holds shard_tokens tokens (so both
    splits' shards end at the same document, the one progress.json records); returns the final progress."""
    from tqdm import tqdm
    state_path = d / "progress.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else \
        {"next_doc": 0, "shards": {"train": [], "val": []}, "tokens": {"train": 0, "val": 0}}
    start = state["next_doc"]
    bufs = {"train": [], "val": []}
    sizes = {"train": 0, "val": 0}

    def flush(next_doc: int):
        for split, buf in bufs.items():
            if buf:
                name = f"{split}_{len(state['shards'][split]):05d}.bin"
                write_shard(d / name, np.concatenate(buf), tok.vocab_size)
                state["shards"][split].append(name)
                state["tokens"][split] += sizes[split]
                bufs[split], sizes[split] = [], 0
        state["next_doc"] = next_doc
        write_atomic(state_path, json.dumps(state))

    bar = tqdm(total=total, initial=start, disable=not progress, unit="doc", desc=f"tokenizing {d.name}",
               dynamic_ncols=True, file=sys.stdout)
    i = start - 1
    for i, ids in enumerate(_tokenized(itertools.islice(docs, start, None), tok, workers), start):
        split = "val" if i % val_every == val_every - 1 else "train"
        bufs[split].append(ids)
        sizes[split] += len(ids)
        bar.update(1)
        if sizes["train"] >= shard_tokens:
            flush(i + 1)
            bar.set_postfix(shards=len(state["shards"]["train"]), tokens=f"{state['tokens']['train']:,}")
    flush(i + 1)
    bar.close()
    return state


def prepare(cfg, progress: bool = True, tokenizer: Tokenizer | None = None) -> DataInfo:
    """Tokenize the source into shards once (cached; an interrupted run resumes). With `tokenizer`, use it instead
    of the configured one (evaluating a checkpoint on other data must use the checkpoint's tokenizer)."""
    cfg = dict(cfg)
    name = cfg.get("name")
    if name in ARRAYS:
        return ARRAYS[name](cfg, tokenizer)
    if tokenizer is not None:
        # the run's own cache when it was prepared with this very tokenizer (eval.py on a run or its export: the
        # corpus was tokenized into a second, byte-identical folder, issue #76); else a folder of its own
        own = Path(cfg.get("cache_dir") or "cache") / f"{name}-{_key(cfg)}"
        if name in SOURCES and (own / "meta.json").exists() and (own / "tokenizer.json").exists() and \
                _read_json(own / "tokenizer.json") == tokenizer.to_dict() and (
                    name not in FINGERPRINTS or ((own / "sources.json").exists()
                                                 and _read_json(own / "sources.json") == FINGERPRINTS[name](cfg))):
            return open_prepared(own)
        cfg["tokenizer"] = "given:" + hashlib.sha256(json.dumps(tokenizer.to_dict()).encode()).hexdigest()[:10]
    if name not in SOURCES:
        raise ShardError(f"unknown text source data={name!r}; valid choices: {sorted(SOURCES) + sorted(ARRAYS)} (a "
                         "synthetic task such as data=parity is generated at start-up: nothing to prepare)")
    d = Path(cfg.get("cache_dir") or "cache") / f"{name}-{_key(cfg)}"
    sources = FINGERPRINTS[name](cfg) if name in FINGERPRINTS else None
    if sources is not None and d.is_dir() and any(d.iterdir()):
        then = _read_json(d / "sources.json") if (d / "sources.json").exists() else None
        if then != sources:
            print(f"data={name}: {_changes(then, sources)} since {d} was prepared: preparing it again",
                  file=sys.stderr)
            shutil.rmtree(d)
    if (d / "meta.json").exists():
        return open_prepared(d)
    d.mkdir(parents=True, exist_ok=True)
    if sources is not None:
        write_atomic(d / "sources.json", json.dumps(sources))
    every = int(cfg.get("val_every", 20))
    docs = SOURCES[name](cfg)
    if (d / "tokenizer.json").exists():  # an interrupted run: its shards were written with this tokenizer
        tok = Tokenizer.from_dict(_read_json(d / "tokenizer.json"))
    else:
        kind = cfg.get("tokenizer", "bpe")
        train_docs = None
        if tokenizer is None and kind == "bpe":  # trained on the training documents (the first bpe_docs of them)
            limit = cfg.get("bpe_docs")
            src = docs if isinstance(docs, list) else SOURCES[name](cfg)  # a stream is read again from its start
            train_docs = (x for i, x in enumerate(src) if i % every != every - 1)
            train_docs = list(itertools.islice(train_docs, limit) if limit else train_docs)
        tok = tokenizer or make_tokenizer(kind, train_docs, int(cfg.get("vocab_size", 4096)))
        write_atomic(d / "tokenizer.json", json.dumps(tok.to_dict()))
    total = len(docs) if hasattr(docs, "__len__") else cfg.get("max_docs")
    state = write_shards(docs, tok, d, every, int(cfg.get("shard_tokens", 100_000_000)),
                         int(cfg.get("workers") or 1), progress, total)
    n_docs = state["next_doc"]
    if not state["shards"]["train"] or not state["shards"]["val"]:
        # what helps: more documents (data=text: the same files cut by paragraph or line), then, with two or more,
        # a smaller val_every (with one document no val_every holds one out)
        ways = (["data.sample_by=paragraph (or line) to cut the files into more documents"] if name == "text" else [])
        ways += ["more documents"] + ([f"a smaller data.val_every (at most {n_docs})"] if n_docs >= 2 else [])
        raise ShardError(f"data={name}: {n_docs} document{'s are' if n_docs != 1 else ' is'} too few for a "
                         f"train/validation split (every data.val_every={every}-th document is held out): use "
                         + ", or ".join(ways))
    meta = {"name": name, "train": state["shards"]["train"], "val": state["shards"]["val"],
            "n_train_tokens": state["tokens"]["train"], "n_val_tokens": state["tokens"]["val"],
            "n_docs": n_docs, "vocab_size": tok.vocab_size, "eot_id": tok.eot_id, "config": cfg}
    write_atomic(d / "meta.json", json.dumps(meta, indent=1, default=str))
    return open_prepared(d)
