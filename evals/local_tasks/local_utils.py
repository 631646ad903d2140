"""The JSONL beside these task YAMLs, found from this file's own folder: `lm_eval --include_path` works from any
working directory (datasets resolves a relative data_files path against the current one). evals/retrieval.py copies
this file beside the retrieval tasks it writes, whose per-example metrics are here too. Self-contained: lm-eval imports
it by path."""

from pathlib import Path


def load(file: str, **_):
    """custom_dataset: {"test": the rows of `file`} (lm-eval's metadata and model args also arrive: ignored)."""
    import datasets
    return {"test": datasets.Dataset.from_json(str(Path(__file__).with_name(file)))}


def process_generation(doc: dict, results: list) -> dict:
    """RULER's string_match_all: the share of the expected values in the continuation (cut at lm-eval's `until`),
    ignoring case, after its postprocessing (stripped)."""
    prediction = results[0].strip().lower()
    return {"string_match": sum(v.lower() in prediction for v in doc["values"]) / len(doc["values"])}


def process_loglikelihood(doc: dict, results: list) -> dict:
    logprob, is_greedy = results[0]
    return {"greedy": float(is_greedy), "logprob": float(logprob)}
