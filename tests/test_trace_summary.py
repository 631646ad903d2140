"""benchmarks/trace_summary.py: a hand-made trace's step time, GPU busy time, compute and exposed NCCL time, by hand."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from trace_summary import summarize, union_us

ROOT = Path(__file__).resolve().parents[1]


def _x(name, cat, ts, dur):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur}


EVENTS = [
    _x("ProfilerStep#3", "user_annotation", 0, 100), _x("ProfilerStep#4", "user_annotation", 100, 100),
    _x("ProfilerStep#3", "gpu_user_annotation", 0, 500),  # the GPU's copy of the step marker: not a step
    _x("gemm_a", "kernel", 0, 50), _x("gemm_b", "kernel", 40, 40),  # compute: [0, 80)
    _x("ncclDevKernel_AllGather", "kernel", 70, 50),  # [70, 120): 10 under compute, 40 exposed
    _x("Memcpy HtoD", "gpu_memcpy", 150, 10),  # compute: [150, 160)
    _x("late_kernel", "kernel", 200 + 60_000, 5),  # past the window and the GPU's 50 ms lag: not counted
    _x("Optimizer.step#AdamW.step", "user_annotation", 90, 20),
]


def test_union_counts_overlaps_once():
    assert union_us([(5, 9), (0, 3), (2, 4), (9, 10)]) == 9
    assert union_us([]) == 0


def test_summary_of_a_hand_made_trace():
    s = summarize(EVENTS)
    assert s["steps"] == 2
    # per step (2 steps), in ms: host 200 us, busy [0, 120) + [150, 160) = 130 us, compute 90, NCCL 50, exposed 40
    assert s["host_ms"] == pytest.approx(0.100) and s["gpu_busy_ms"] == pytest.approx(0.065)
    assert s["compute_ms"] == pytest.approx(0.045) and s["nccl_ms"] == pytest.approx(0.025)
    assert s["nccl_exposed_ms"] == pytest.approx(0.020) and s["gpu_idle_ms"] == pytest.approx(0.035)
    assert s["kernels"][0] == ("gemm_a", pytest.approx(0.025)) and "late_kernel" not in dict(s["kernels"])
    assert s["annotations"] == [("Optimizer.step#AdamW.step", pytest.approx(0.010))]
    with pytest.raises(ValueError, match="no ProfilerStep# annotations"):
        summarize([e for e in EVENTS if not e["name"].startswith("ProfilerStep")])


def test_cli_prints_and_writes_the_summary(tmp_path):
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": EVENTS}))
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks/trace_summary.py"), str(tmp_path / "trace.json"),
                        "--json", str(tmp_path / "s.json")], capture_output=True, text=True, check=True)
    assert p.stdout.startswith("2 steps, ms a step: host 0.1, GPU busy 0.1 (idle 0.0), compute 0.0, NCCL 0.0 of "
                               "which exposed 0.0")
    assert json.loads((tmp_path / "s.json").read_text())["nccl_exposed_ms"] == pytest.approx(0.020)
