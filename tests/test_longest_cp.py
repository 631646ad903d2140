"""benchmarks/longest_cp.py on the CPU with gloo: one sequence split over 2 processes gives the one-process loss, and
the report names the longest length per process count (the GPU measurement: docs/multi_gpu)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "longest_cp.py"


def _run(tmp_path, n, case, documents=0):
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"] if n > 1
           else [sys.executable])
    out = tmp_path / "rows.jsonl"
    p = subprocess.run(cmd + [str(SCRIPT), "--case", case, "--size", "tiny", "--lengths", "64", "128", "--steps", "1",
                              "--documents", str(documents), "--out", str(out), "--set"],
                       capture_output=True, text=True, timeout=600,
                       env={"OMP_NUM_THREADS": "1", **__import__("os").environ})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case, documents", [("gla+nope", 0), ("transformer+rope", 0), ("gated_deltanet+nope", 20),
                                             ("gla+selective_rope", 20)])
def test_split_sequence_matches_one_process(tmp_path, case, documents):
    """documents: packed documents of mean length 20, crossing the slices (--documents)."""
    _run(tmp_path, 1, case, documents)
    out = _run(tmp_path, 2, case, documents)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["gpus"], r["seq_len"]) for r in rows] == [(1, 64), (1, 128), (2, 64), (2, 128)]
    # the first step (initial weights, the same tokens): bf16 autocast, so equal to rounding
    assert rows[2]["loss"] == pytest.approx(rows[0]["loss"], abs=5e-3)
    subprocess.run([sys.executable, str(SCRIPT), "--report", str(out), "--command", "test"], check=True,
                   capture_output=True)
    record = json.loads(out.with_suffix(".json").read_text())
    two = next(s for s in record["summary"] if s["gpus"] == 2)
    assert two["longest"]["seq_len"] == 128 and two["x_one_gpu"] == 1.0 and two["loss_diff_first"] < 5e-3
    # no length ran out of memory: the longest is a lower bound
    label = case + (f" docs {documents}" if documents else "")
    assert f"| {label} tiny | 2 | ≥ 128 |" in out.with_suffix(".md").read_text()


def test_summary_reads_an_oom_row(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from longest_cp import summarise
    row = {"case": "gla+nope", "size": "370m", "device": "H100", "loss": 10.0, "tokens_per_s": 1.0}
    rows = [{**row, "gpus": 1, "seq_len": 65536}, {**row, "gpus": 1, "seq_len": 262144},
            {**row, "gpus": 1, "seq_len": 327680, "oom": True},
            {**row, "gpus": 4, "seq_len": 65536, "loss": 10.001}, {**row, "gpus": 4, "seq_len": 1048576},
            {**row, "gpus": 4, "seq_len": 1310720, "oom": True, "rank": 2}]
    one, four = summarise(rows)
    assert (one["longest"]["seq_len"], one["oom_at"], one["x_one_gpu"]) == (262144, 327680, 1.0)
    assert (four["longest"]["seq_len"], four["oom_at"], four["x_one_gpu"]) == (1048576, 1310720, 4.0)
    assert four["loss_diff_first"] == pytest.approx(1e-3)
