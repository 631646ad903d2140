"""`data=text`: local text or JSON-lines files, read with `datasets.load_dataset` (offline: local files only).

data.files: a path, glob or list of them. data.format: `auto` (json for .jsonl / .json files, else text), `text`
(plain files; data.sample_by = document | paragraph | line decides what one document is) or `json` (JSON lines;
data.text_field names the field holding the text).
"""

from __future__ import annotations

import glob
import sys
from pathlib import Path

from .shards import ShardError


def _expand(files) -> list[str]:
    if files is None:
        raise ShardError("data=text needs data.files=<path, glob or [list]> of local .txt or .jsonl files")
    patterns = [files] if isinstance(files, str) else list(files)
    out = []
    for p in patterns:
        hits = sorted(glob.glob(str(Path(p).expanduser())))
        if not hits:
            raise FileNotFoundError(f"data.files: nothing matches {p!r}")
        out += hits
    return out


def fingerprint(files) -> list:
    """(path, size, mtime) of every file data.files names: the prepared cache is only valid for these."""
    out = []
    for f in _expand(files):
        st = Path(f).stat()
        out.append([str(Path(f).resolve()), st.st_size, st.st_mtime_ns])
    return out


def _first_bad_line(paths, check) -> str | None:
    """Where reading failed, as `file:line: what`: datasets' own error is a long traceback without the line."""
    for path in paths:
        with open(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    return f"{path}:{n}: not UTF-8 text ({e.reason} at byte {e.start} of the line)"
                msg = check(line)
                if msg:
                    return f"{path}:{n}: {msg}"
    return None


def _json_error(line: str) -> str | None:
    import json
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        return f"not valid JSON ({e.msg}, column {e.colno})"
    return None if isinstance(row, dict) else f"a JSON {type(row).__name__}, not an object"


# JSON lines whose text field is missing or null: reported when any, an error above this share of the rows
MAX_MISSING = 0.1


def documents(files, format: str = "auto", text_field: str = "text", sample_by: str = "document") -> list[str]:
    from datasets import load_dataset

    paths = _expand(files)
    if format == "auto":  # from the files' extensions: JSON lines for .jsonl / .json, plain text otherwise
        kinds = {Path(p).suffix.lower() in (".jsonl", ".json") for p in paths}
        if len(kinds) > 1:
            raise ShardError(f"data.files mixes JSON-lines (.jsonl, .json) and text files ({paths[:4]}...); set "
                             "data.format=json or data.format=text, or name one kind")
        format = "json" if kinds == {True} else "text"
    if format == "text":
        if sample_by not in ("document", "paragraph", "line"):
            raise ShardError(f"data.sample_by={sample_by!r}; valid: document, paragraph, line")
        load, check = (lambda: load_dataset("text", data_files=paths, split="train", sample_by=sample_by)), None
    elif format == "json":
        load, check = (lambda: load_dataset("json", data_files=paths, split="train")), _json_error
    else:
        raise ShardError(f"data.format={format!r}; valid: auto, text, json")
    try:
        ds = load()
    except Exception as e:  # datasets wraps the cause (JSON, UTF-8) in its own errors: find the line
        where = _first_bad_line(paths, check or (lambda line: None))
        raise ShardError(f"data.files: {where}" if where else f"data.files: datasets cannot read {paths}: "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    if format == "text":
        return [t for t in ds["text"] if t and t.strip()]
    if text_field not in ds.column_names:
        raise ShardError(f"data.text_field={text_field!r} is not a field of {paths[0]}; fields: {ds.column_names}")
    col = ds[text_field]
    missing = sum(t is None for t in col)
    if missing > MAX_MISSING * len(col):
        raise ShardError(f"data.text_field={text_field!r} is missing or null in {missing:,} of {len(col):,} rows of "
                         f"{paths if len(paths) > 1 else paths[0]}; fields: {ds.column_names}")
    if missing:
        print(f"data=text: {missing:,} of {len(col):,} rows have no {text_field!r}: skipped", file=sys.stderr)
    return [t for t in col if t and t.strip()]
