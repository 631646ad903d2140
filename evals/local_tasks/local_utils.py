"""The JSONL beside these task YAMLs, found from this file's own folder: `lm_eval --include_path` works from any
working directory (datasets resolves a relative data_files path against the current one)."""

from pathlib import Path


def load(file: str, **_):
    """custom_dataset: {"test": the rows of `file`} (lm-eval's metadata and model args also arrive: ignored)."""
    import datasets
    return {"test": datasets.Dataset.from_json(str(Path(__file__).with_name(file)))}
