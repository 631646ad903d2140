"""Graceful stop on a scheduler's signal: Slurm and Kubernetes send SIGTERM before SIGKILL (and Slurm can send SIGUSR1
ahead of a time limit, `--signal=USR1@90`); Ctrl-C is SIGINT. The handler only notes the signal; the loop finishes
the step it is in, all ranks agree to stop at the same step, the run checkpoints there and exits as it does at
train.time_limit, the other pause: resume=auto goes on from that step."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import torch

NAMES = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP")


def check_signals(names) -> list[str]:
    """train.stop_signals as a list of signal names, refused with the valid ones if any is unknown."""
    from duality.common.errors import ConfigError
    names = list(names or [])
    bad = [n for n in names if n not in NAMES]
    if bad:
        raise ConfigError(f"train.stop_signals: {bad} unknown; choose from {list(NAMES)} (or [] for none)")
    return names


class StopSignals:
    """Handlers for the named signals from construction until restore() (or the end of a `with` block); the first
    signal sets `received`, a later one during the checkpoint is noted and ignored, so the save is never cut."""

    def __init__(self, names):
        self.names, self.received, self._old = check_signals(names), None, {}
        if threading.current_thread() is threading.main_thread():  # Python lets only the main thread install them
            for name in self.names:
                if name == "SIGHUP" and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
                    continue  # nohup: the user asked for the run to outlive the terminal
                self._old[name] = signal.signal(getattr(signal, name), self._note)

    def _note(self, signum, _frame):
        name = signal.Signals(signum).name
        if self.received is None:
            self.received = name
        else:
            print(f"{name} received while stopping: the checkpoint is being written, please wait", file=sys.stderr,
                  flush=True)

    def restore(self) -> None:
        """The handlers there were before."""
        for name, old in self._old.items():
            signal.signal(getattr(signal, name), old)
        self._old = {}

    def close(self) -> None:
        """The end of a run: the handlers there were before, or, when the run stopped on one of these signals and
        the process ends with the run (train.py's command line: common/cli.py sets DUALITY_CLI), those signals
        ignored from then on: a second SIGTERM 50 ms after the first arrived after the checkpoint, as the process
        exited, and killed it with -15 instead of exit 0. A caller that runs train.run in its own process gets its
        handlers back."""
        if self.received is None or not os.environ.get("DUALITY_CLI"):
            return self.restore()
        for name in self._old:
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        self._old = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()
        return False

    def pause(self, rt, t, done: int, last: bool) -> str | None:
        """Why the loop stops after step `done` and goes on later (resume=auto), or None: a stop signal (any rank,
        checked every step) or train.time_limit (rank 0's clock, at log steps). Never at the last step: it ends."""
        if last:
            return None
        if self.requested(rt):
            return f"{self.received}: stopped after this step"
        if t.get("time_limit") and done % t.log_interval == 0 and \
                rt.master_decides(time.perf_counter() - rt.started > t.time_limit):
            return f"train.time_limit={t.time_limit} s reached"
        return None

    def requested(self, rt) -> bool:
        """Whether any rank got a signal: every rank stops at the same step (one reduction a step when several)."""
        flag = self.received is not None
        if not rt.distributed:
            return flag
        import torch.distributed as dist
        t = torch.tensor(float(flag), device=rt.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if t.item() and self.received is None:
            self.received = "a signal on another rank"
        return bool(t.item())
