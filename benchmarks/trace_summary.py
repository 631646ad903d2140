"""Where a profiled training step's time goes, from the torch.profiler trace that train.profile_steps writes: the
host's wall time a step, the time the GPU was busy (any kernel, copy or fill on any stream, overlaps counted once),
the compute alone (everything but NCCL), the NCCL kernels' total and how much of it no compute overlapped (exposed
communication: what a step would save were it hidden), and the costliest kernels and annotations.

    python benchmarks/trace_summary.py OUT_DIR/profile/trace.json [--top 10] [--json row.json]

The window is the profiled steps' `ProfilerStep#` annotations on the host; a kernel belongs to it if it starts
inside it (or within 50 ms after, the GPU's lag behind the host). NCCL kernels run as long as their slowest peer
takes to arrive, so their time includes waiting.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAG_US = 50_000


def union_us(intervals) -> float:
    """Length of the union of [start, end) intervals (microseconds)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        total += max(e - max(s, end), 0)  # the part past everything seen so far
        end = max(end, e)
    return total


def summarize(events: list, top: int = 10) -> dict:
    """Per-step milliseconds of the profiled steps (see the module's docstring)."""
    steps = [e for e in events if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")
             and e.get("cat") != "gpu_user_annotation"]
    if not steps:
        raise ValueError("no ProfilerStep# annotations: not a trace of train.profile_steps")
    t0, t1, n = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps), len(steps)
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS and t0 <= e["ts"] <= t1 + LAG_US]
    span = [(e["ts"], e["ts"] + e["dur"]) for e in gpu]
    nccl = [e for e in gpu if "nccl" in e["name"].lower()]
    compute = [(e["ts"], e["ts"] + e["dur"]) for e in gpu if "nccl" not in e["name"].lower()]
    busy, busy_compute = union_us(span), union_us(compute)
    kernels = collections.Counter()
    for e in gpu:
        kernels[e["name"][:80]] += e["dur"]
    notes = collections.Counter()
    for e in events:
        if (e.get("ph") == "X" and e.get("cat") == "user_annotation" and t0 <= e["ts"] <= t1
                and not e["name"].startswith("ProfilerStep#")):
            notes[e["name"][:80]] += e["dur"]
    ms = 1e-3 / n
    return {"steps": n, "host_ms": (t1 - t0) * ms, "gpu_busy_ms": busy * ms, "compute_ms": busy_compute * ms,
            "nccl_ms": sum(e["dur"] for e in nccl) * ms, "nccl_exposed_ms": (busy - busy_compute) * ms,
            "gpu_idle_ms": max(t1 - t0 - busy, 0.0) * ms,
            "kernels": [(k, v * ms) for k, v in kernels.most_common(top)],
            "annotations": [(k, v * ms) for k, v in notes.most_common(top)]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--json", type=Path, help="also write the summary here")
    a = ap.parse_args()
    s = summarize(json.loads(a.trace.read_text())["traceEvents"], a.top)
    print(f"{s['steps']} steps, ms a step: host {s['host_ms']:.1f}, GPU busy {s['gpu_busy_ms']:.1f} (idle "
          f"{s['gpu_idle_ms']:.1f}), compute {s['compute_ms']:.1f}, NCCL {s['nccl_ms']:.1f} of which exposed "
          f"{s['nccl_exposed_ms']:.1f}")
    for name, v in s["kernels"]:
        print(f"  {v:8.2f} ms  {name}")
    for name, v in s["annotations"]:
        print(f"  {v:8.2f} ms  host: {name}")
    if a.json:
        a.json.write_text(json.dumps(s, indent=1))


if __name__ == "__main__":
    main()
