"""`data=fineweb` / `data=fineweb_edu`: FineWeb (Penedo et al. 2024) and FineWeb-Edu, streamed from the Hugging Face
hub or read from local copies of the same files.

    hub:    load_dataset(data.hf_path, name=data.sample, split="train", streaming=True)
            data.sample: sample-10BT | sample-100BT | sample-350BT | default (everything)
    local:  data.files = path, glob or list of the dataset's parquet files (or JSON lines with the same `text` field);
            nothing is downloaded, so this is the offline path (and the one the tests run).

A document is a row's data.text_field, in the dataset's order; data.max_docs stops early (a quick run, or a fixed
token budget). data/__init__.py tokenizes the stream in data.workers processes into resumable shards; prepare it
ahead of training with `python data/prepare.py data=fineweb ...` (docs/data.md).
"""

from __future__ import annotations

import itertools
import os

from duality.common.errors import HubUnavailable, ShardError

from .text import _expand

FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".gz": "json"}


def _local(files):
    from datasets import load_dataset
    paths = _expand(files)
    kinds = {FORMATS.get(os.path.splitext(p)[1]) for p in paths}
    if None in kinds or len(kinds) > 1:
        raise ShardError(f"data.files must all be .parquet or all JSON lines (.jsonl/.json/.json.gz); got {paths[:5]}")
    return load_dataset(kinds.pop(), data_files=paths, split="train", streaming=True), paths[0]


def _hub(hf_path: str, sample: str | None):
    from datasets import load_dataset
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        raise HubUnavailable(f"data: streaming {hf_path} ({sample}) needs the Hugging Face hub, and HF_HUB_OFFLINE / "
                           "HF_DATASETS_OFFLINE is set; point data.files at local parquet files instead")
    try:
        return load_dataset(hf_path, name=sample, split="train", streaming=True), hf_path
    except Exception as e:  # the hub client raises many kinds of errors when offline
        raise HubUnavailable(f"data: could not stream {hf_path} ({sample}) from the Hugging Face hub "
                           f"({type(e).__name__}: {e}). Offline? Download its parquet files elsewhere and pass "
                           "data.files='<dir>/*.parquet'") from None


def documents(cfg):
    """The documents' texts, lazily (a stream of millions)."""
    ds, where = _local(cfg["files"]) if cfg.get("files") else _hub(cfg.get("hf_path"), cfg.get("sample"))
    field = cfg.get("text_field", "text")
    if ds.column_names is not None and field not in ds.column_names:
        raise ShardError(f"data.text_field={field!r} is not a column of {where}; columns: {ds.column_names}")
    docs = (row[field] for row in ds if row[field] and row[field].strip())
    return itertools.islice(docs, cfg["max_docs"]) if cfg.get("max_docs") else docs
