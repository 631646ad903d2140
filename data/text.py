"""`data=text`: local text or JSON-lines files, read with `datasets.load_dataset` (offline: local files only).

data.files: a path, glob or list of them. data.format: `text` (plain files; data.sample_by = document | paragraph |
line decides what one document is) or `json` (JSON lines; data.text_field names the field holding the text).
"""

from __future__ import annotations

import glob
from pathlib import Path


def _expand(files) -> list[str]:
    if files is None:
        raise ValueError("data=text needs data.files=<path, glob or [list]> of local .txt or .jsonl files")
    patterns = [files] if isinstance(files, str) else list(files)
    out = []
    for p in patterns:
        hits = sorted(glob.glob(str(Path(p).expanduser())))
        if not hits:
            raise FileNotFoundError(f"data.files: nothing matches {p!r}")
        out += hits
    return out


def documents(files, format: str = "text", text_field: str = "text", sample_by: str = "document") -> list[str]:
    from datasets import load_dataset
    paths = _expand(files)
    if format == "text":
        if sample_by not in ("document", "paragraph", "line"):
            raise ValueError(f"data.sample_by={sample_by!r}; valid: document, paragraph, line")
        ds = load_dataset("text", data_files=paths, split="train", sample_by=sample_by)
        col = "text"
    elif format == "json":
        ds = load_dataset("json", data_files=paths, split="train")
        if text_field not in ds.column_names:
            raise ValueError(f"data.text_field={text_field!r} is not a field of {paths[0]}; fields: {ds.column_names}")
        col = text_field
    else:
        raise ValueError(f"data.format={format!r}; valid: text, json")
    return [t for t in ds[col] if t and t.strip()]
