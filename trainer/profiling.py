"""train.profile_steps=N: a torch.profiler trace of N steps after train.profile_after steps (default 3: compilation,
autotuning), written to out_dir/profile/ (open trace.json in https://ui.perfetto.dev) with a table of the costliest
ops. A later start profiles the steady state of runs that warm up longer (FSDP2 took ~15 steps on 4 GPUs)."""

from __future__ import annotations

import sys
from pathlib import Path


class Profiler:
    def __init__(self, t, out_dir: Path, rt):
        """t: the train config (profile_steps, profile_after); rt: the runtime (master, device)."""
        from torch.profiler import ProfilerActivity, profile, schedule
        n, after = t.profile_steps, t.get("profile_after", 3)
        self.dir, self.master, self.n, self.after = out_dir / "profile", rt.master, n, after
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if rt.device.type == "cuda" else [])
        self.prof = profile(activities=acts, schedule=schedule(wait=max(after - 1, 0), warmup=min(after, 1),
                                                                    active=n, repeat=1),
                            on_trace_ready=self._write)
        self.prof.start()
        self.running = True

    def step(self, i: int):
        """Called before step i of this process (the profiler counts the steps that ended)."""
        if i > 0 and self.running:
            self.prof.step()
            if i >= self.after + self.n:
                self.close()

    def close(self):
        if self.running:
            self.prof.stop()
            self.running = False

    def _write(self, prof):
        if not self.master:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.dir / "trace.json"))
        sort = "cuda_time_total" if any(e.device_type.name == "CUDA" for e in prof.events()) else "cpu_time_total"
        (self.dir / "ops.txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=40))
        print(f"profile of {self.n} steps: {self.dir}/trace.json, {self.dir}/ops.txt", file=sys.stderr)
