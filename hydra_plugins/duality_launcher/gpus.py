"""A Hydra launcher that deals a sweep's jobs out to the GPUs of one machine: `hydra/launcher=gpus`.

    python train.py -m sweep=parity hydra/launcher=gpus                          # every visible GPU, a job on each
    python train.py -m sweep=parity hydra/launcher=gpus hydra.launcher.per_gpu=4 # small models: 4 jobs a GPU at once
    python train.py -m sweep=results_mqar hydra/launcher=gpus hydra.launcher.deadline=540   # resumable in pieces
    python train.py -m sweep=results_s2 hydra/launcher=gpus hydra.launcher.start_by=900     # none starts after 15 min

Hydra's basic launcher runs the jobs one after another in its own process, on one GPU; the submitit launcher's local
mode gives every job the same GPUs. Here each job is a process of its own, started with CUDA_VISIBLE_DEVICES set to
one GPU, the one with the most free places when the job starts, so jobs of unequal length keep every GPU busy.
Launches on one machine share each GPU's `per_gpu` places (lock files in `slots_dir`): two sweeps started side by side
fill the GPUs together, and neither waits for the other's last job to end; a launch logs `every job dealt` once each
of its jobs runs, waits for a place or was passed over (scripts/results_sweeps.sh starts the next launch then, so the
earlier one's jobs take the places first). A job's output goes to `<its folder>/job.log`; `<sweep
folder>/launcher.jsonl` says which GPU ran which job, when, and how it ended. A sweep too long for one sitting runs in
pieces: `deadline` (seconds after the launch) sends every job still running the trainer's stop signal (SIGTERM: it
checkpoints and exits; resume=auto goes on) and starts no more (so does a SIGTERM, SIGINT, SIGUSR1 or SIGHUP to the
launcher, at once); with a fixed hydra.sweep.dir and subdir the same command continues, and `skip_done` (a file, or a
list of files, a job that is over leaves in its folder: task_eval.json, and nonfinite.json where it diverged) passes
over those jobs; `record` (a results record, docs/results/<task>.json) passes over the runs it holds as over, so a
sweep whose folders are gone (a machine wiped between leases, another cluster's scratch) continues from what the
record already has. `start_by` (seconds after the launch) starts no job after it and lets the running ones finish: the
end of a lease, where a paused job's checkpoint would be lost with the machine. `finish_by` (seconds after the launch)
starts a job only if it is expected to end by then, and goes on to the next job otherwise: expected from
launcher.jsonl (every launch's into the sweep folder, read as it grows) and the record's runs, the longest completed
job of the same backbone, at this launch's per_gpu (else the median of the backbones' longest; a job with nothing to
go by starts), so a lease's last minutes still run the short jobs and no long one is started to be lost. The three
count from the launcher's start, which Hydra makes before its sweeper composes every job's config to check it (50 s
for a results sweep's 216 jobs on a 2-core CPU); the launcher composes a job's config again when a GPU place takes it,
not all first (another 40 s of idle GPUs). `precheck` (a function's dotted name, the job's config -> why it cannot
run, or None) refuses a job before its process starts, with `error: <why>` in its job.log, taking no GPU place: the
repo's is the model's refusal of a backbone x scheme pair, which a results sweep (a product of backbones and schemes)
meets for half its jobs by design. A refused job is REFUSED in launcher.jsonl and the summary, not a failure. `ready`
(a function's dotted name too, the job's config -> why it cannot run yet, or None) holds a job for a later launch:
WAITING, passed over like a job with no time left, no folder, no process, no place; the repo's is a results sweep's
seeds job whose pair's grid is not over (best_lr has nothing to choose from yet: common/grid.py). Each job is Hydra's
own multirun job (its folder, hydra.job.num, the sweep's wandb group), as the basic launcher would run it. Where any
job failed (its process exited non-zero: a fault, or a grid diverged at every lr, with no lr for its seeds), the
launch ends after its summary with one line and exit code 1, not the traceback of the first failed job that Hydra's
basic sweeper would print. The job is handed over with cloudpickle (a dependency of submitit, so installed with this
repo) because the task function Hydra passes is a closure.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import queue
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterable, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)
OVER = ("finished", "diverged")  # a results record's run statuses that are an outcome (scripts/results.py)
# launcher.jsonl's statuses of a job that took no GPU place (no process ran): passed over, refused, held back
NO_PLACE = ("DONE_BEFORE", "NOT_STARTED", "REFUSED", "WAITING")


class GPUsLauncher(Launcher):
    def __init__(self, gpus: Sequence[int | str] | None = None, per_gpu: int = 1, deadline: float | None = None,
                 skip_done: str | Sequence[str] | None = None, start_by: float | None = None,
                 finish_by: float | None = None, slots_dir: str | None = None, precheck: str | None = None,
                 record: str | None = None, ready: str | None = None) -> None:
        if int(per_gpu) < 1:
            raise ValueError(f"hydra.launcher.per_gpu={per_gpu}: at least 1 job a GPU at once")
        if deadline is not None and float(deadline) <= 0:
            raise ValueError(f"hydra.launcher.deadline={deadline}: seconds after the launch, > 0 (null: none)")
        if start_by is not None and float(start_by) <= 0:
            raise ValueError(f"hydra.launcher.start_by={start_by}: seconds after the launch, > 0 (null: none)")
        if finish_by is not None and float(finish_by) <= 0:
            raise ValueError(f"hydra.launcher.finish_by={finish_by}: seconds after the launch, > 0 (null: none)")
        self.gpus, self.per_gpu = (None if gpus is None else [_gpu(g) for g in gpus]), int(per_gpu)
        self.deadline = None if deadline is None else float(deadline)
        self.start_by = None if start_by is None else float(start_by)
        self.finish_by = None if finish_by is None else float(finish_by)
        self.skip_done = [] if skip_done is None else [skip_done] if isinstance(skip_done, str) else list(skip_done)
        self.slots_dir = Path(slots_dir or Path(tempfile.gettempdir()) / f"duality-gpu-slots-{os.getuid()}")
        self.precheck, self.ready = precheck, ready
        self.record = record
        # Hydra makes the launcher before its sweeper composes every job's config to check it (~50 s for a results
        # sweep's 216 jobs on a 2-core CPU): the launch's clock starts here, nearer the command's own start
        self.created = time.time()
        self.config = self.task_function = self.hydra_context = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.task_function, self.hydra_context = config, task_function, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import cloudpickle

        now = self.created  # deadline, start_by and finish_by count from the launcher's start
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        # this launch's job payloads: a folder of its own, as another launch may share the sweep folder (a task's grid
        # and seeds side by side), and job numbers start at 0 in each
        payloads = sweep_dir / ".launcher" / f"{socket.gethostname()}-{os.getpid()}"
        payloads.mkdir(parents=True, exist_ok=True)
        gpus = self.gpus if self.gpus is not None else visible_gpus()
        at_once = self.per_gpu * max(1, len(gpus))  # with no GPU, per_gpu jobs share the CPU
        # CPU threads a job: the cores shared out over the jobs that run at once, as torchrun does (each process's
        # default is every core, and 6 jobs' spinning OpenMP threads on 64 cores slowed each to a GPU-idle crawl)
        omp = os.environ.get("OMP_NUM_THREADS") or str(max(1, len(os.sched_getaffinity(0)) // at_once))
        log.info(f"Launching {len(job_overrides)} jobs on {f'GPUs {gpus}' if gpus else 'the CPU'}, "
                 f"{self.per_gpu} at once on each, {omp} CPU threads each")
        todo: queue.Queue = queue.Queue()
        for i, overrides in enumerate(job_overrides):
            todo.put((initial_job_idx + i, list(overrides)))
        results: dict[int, JobReturn] = {}
        lock = threading.Lock()
        composing = threading.Lock()  # Hydra's config loader, one job at a time

        def compose(idx: int, overrides: list[str]) -> tuple[DictConfig, Path]:
            """A job's config and folder, when a worker takes it: a results sweep's 216, made before the first job,
            kept the GPUs idle ~40 s on a 2-core CPU."""
            with composing:
                cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
            with open_dict(cfg):
                cfg.hydra.job.id = idx
                cfg.hydra.job.num = idx
            return cfg, Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        end = None if self.deadline is None else now + self.deadline
        last_start = min(end or float("inf"), float("inf") if self.start_by is None else now + self.start_by)
        finish_at = None if self.finish_by is None else now + self.finish_by
        runs = record_runs(self.record)
        lengths = Lengths(sweep_dir / "launcher.jsonl", runs.values(), self.per_gpu)
        # the job imports this module by name: where it is found only from its folder (the repo on PYTHONPATH, not
        # installed), that folder goes on the job's path
        here = str(Path(__file__).resolve().parents[2])
        pythonpath = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), here]))

        ended: dict[str, list[Path]] = {}  # status -> the job folders that ended so, for the summary
        stop = threading.Event()  # a signal to the launcher (_stop_on_signals): stop as at the deadline
        host = socket.gethostname()  # with the GPU, which device a job ran on (scripts/results.py: a run's GPU cost)
        refusal = _function(self.precheck, "precheck") if self.precheck else (lambda cfg: None)
        not_ready = _function(self.ready, "ready") if self.ready else (lambda cfg: None)
        why_not: dict[Path, str] = {}  # a WAITING or NOT_STARTED job's folder (never made) -> why, for the summary
        recorded = {key for key, r in runs.items() if r.get("status") in OVER}

        def note(idx, gpu, overrides, start, status, rc=None, job_dir=None):
            ended.setdefault(status, []).append(job_dir)
            with open(sweep_dir / "launcher.jsonl", "a") as f:
                f.write(json.dumps({"job": idx, "host": host, "gpu": gpu, "overrides": overrides,
                                    "start": round(start, 3), "wall_s": round(time.time() - start, 3), "status": status,
                                    "returncode": rc, "per_gpu": self.per_gpu}) + "\n")

        # "every job dealt" once the queue is empty and no worker is between taking a job and its GPU place: each job
        # runs, waits for a place or was passed over. scripts/results_sweeps.sh starts the next launch on that line,
        # so the earlier launch's jobs take the places first (a fixed 20 s was too short where one composed 144 jobs)
        dealing, dealt = [0], threading.Event()

        def settle(placed: int = 0):  # under `lock`
            dealing[0] -= placed
            if todo.empty() and not dealing[0] and not dealt.is_set():
                dealt.set()
                log.info("every job dealt: each runs, waits for a GPU place or was passed over")

        def worker():
            while True:
                with lock:
                    try:
                        idx, overrides = todo.get_nowait()
                        dealing[0] += 1
                    except queue.Empty:
                        settle()
                        return
                cfg, job_dir = compose(idx, overrides)
                done = any((job_dir / name).exists() for name in self.skip_done) or \
                    _relative(job_dir, sweep_dir) in recorded
                if not done and (why := refusal(cfg)):  # its process would refuse it: none started, no GPU place
                    job_dir.mkdir(parents=True, exist_ok=True)
                    with open(job_dir / "job.log", "a") as out:  # the reason, where the record's cell reads it
                        out.write(f"[launcher] precheck {self.precheck}: the job was not started\nerror: {why}\n")
                    with lock:
                        results[idx] = _passed_over(cfg, job_dir, f"refused: {why}")
                        note(idx, None, overrides, time.time(), "REFUSED", None, job_dir)
                        settle(placed=1)
                    continue
                if not done and (why := not_ready(cfg)):  # e.g. a seeds job whose grid is not over: a later launch
                    with lock:
                        results[idx] = _passed_over(cfg, job_dir, f"waiting: {why}")
                        why_not[job_dir] = why
                        note(idx, None, overrides, time.time(), "WAITING", None, job_dir)
                        settle(placed=1)
                    continue
                with lock:
                    settle(placed=1)
                # a place on a GPU, shared with other launches on this machine (none for a finished job)
                slot = None if done else Slot.take(self.slots_dir, gpus, self.per_gpu, until=last_start, stop=stop)
                gpu = slot.gpu if slot else None
                with lock:
                    expected = lengths.expected(overrides)
                late = finish_at is not None and expected is not None and time.time() + expected > finish_at
                if done or late or time.time() >= last_start or stop.is_set():
                    if slot:
                        slot.free()
                    why = "done" if done else f"expected to take {expected:.0f} s, past finish_by" if late else \
                        "stopped by a signal" if stop.is_set() else "no time to start"
                    with lock:  # passed over: done before, or no time left to start or finish (the next launch)
                        results[idx] = _passed_over(cfg, job_dir, why)
                        if not done:
                            why_not[job_dir] = why
                        note(idx, gpu, overrides, time.time(), "DONE_BEFORE" if done else "NOT_STARTED", None, job_dir)
                    continue
                job_dir.mkdir(parents=True, exist_ok=True)
                payload = payloads / f"{idx}.pkl"
                with composing:  # Hydra's singletons' state, as the job's process is to have it
                    state = cloudpickle.dumps((self.hydra_context, self.task_function, cfg, Singleton.get_state()))
                payload.write_bytes(state)
                env = {**os.environ, "OMP_NUM_THREADS": omp, "PYTHONPATH": pythonpath}
                if gpu is not None:
                    env["CUDA_VISIBLE_DEVICES"] = str(gpu)
                where = "the CPU" if gpu is None else f"GPU {gpu}"
                log.info(f"\t#{idx} on {where}: {' '.join(filter_overrides(overrides))} (log: {job_dir / 'job.log'})")
                start = time.time()
                try:
                    with open(job_dir / "job.log", "ab") as out:
                        proc = subprocess.Popen([sys.executable, "-m", __name__, str(payload)], env=env, stdout=out,
                                                stderr=subprocess.STDOUT)
                        rc, stopped = _wait(proc, end, stop)
                    ret = _read_return(payload, rc, cfg, job_dir)
                    with lock:
                        results[idx] = ret
                        paused = stopped and ret.status == JobStatus.COMPLETED  # checkpointed at the deadline
                        note(idx, gpu, overrides, start, "PAUSED" if paused else ret.status.name, rc, job_dir)
                finally:  # the place is free once the job's end is on record
                    if slot:
                        slot.free()
                if ret.status != JobStatus.COMPLETED:
                    log.error(f"\t#{idx} on {where} failed (exit {rc}): see {job_dir / 'job.log'}")

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(at_once)]
        with _stop_on_signals(stop):
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if stop.is_set():
            log.warning("stopped by a signal: the running jobs checkpointed (PAUSED), none started after it; run the "
                        "same command again to go on")
        for folder in (payloads, payloads.parent):  # empty once every job's payload and result were read
            with contextlib.suppress(OSError):
                folder.rmdir()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        log.info(summary(ended, sweep_dir, why_not))
        failed = len(ended.get("FAILED", []))
        if failed:  # one line and exit 1, where Hydra's sweeper would print the first failed job's traceback
            print(f"error: {failed} of {len(results)} jobs failed (why: the launch's summary above, and each job's "
                  "job.log)", file=sys.stderr, flush=True)
            raise SystemExit(1)
        return [results[i] for i in sorted(results)]


class Slot:
    """One of a GPU's `per_gpu` places, shared by every launch on this machine: an exclusive lock (flock) on one of the
    files <slots_dir>/<gpu>.<k>, k < per_gpu. Two sweeps launched side by side (a task's grid and its seeds, or two
    tasks) so run at most per_gpu jobs on a GPU together, and each takes a place the moment the other frees one: no
    GPU oversubscribed, none idle while a launch still has jobs. The lock goes with its process, so a killed launch
    leaves none behind."""

    def __init__(self, fd: int, gpu):
        self.fd, self.gpu = fd, gpu

    @staticmethod
    def _lock(path: Path) -> int | None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            os.close(fd)
            return None

    @classmethod
    def _is_free(cls, path: Path) -> bool:  # locked and let go at once: a counting taker holds one place at most
        fd = cls._lock(path)
        if fd is not None:
            os.close(fd)
        return fd is not None

    @classmethod
    def take(cls, slots_dir: Path, gpus: Sequence, per_gpu: int, until: float = float("inf"), poll: float = 1.0,
             stop: threading.Event | None = None):
        """A free place on the one of `gpus` with the most free places (waiting for one), or None: for the CPU (no
        gpus), once `until` has passed, or once `stop` is set. Any GPU, not one fixed per job: each launch dealt its
        jobs to the GPUs in turn, so launches side by side all began on GPU 0, and a job bound to a full GPU 0 waited
        while GPUs 1-3 had free places (2026-11-30, 4 x H200: it waited 17 minutes, then had no time left to start)."""
        if not gpus:
            return None
        slots_dir.mkdir(parents=True, exist_ok=True)
        places = {g: [slots_dir / f"{g}.{k}" for k in range(per_gpu)] for g in gpus}
        while time.time() < until and not (stop and stop.is_set()):
            free = {g: sum(map(cls._is_free, paths)) for g, paths in places.items()}
            for g in sorted(gpus, key=lambda g: -free[g]):  # the most free first; a tie in the GPUs' order
                for path in places[g]:
                    if (fd := cls._lock(path)) is not None:
                        return cls(fd, g)
            time.sleep(poll)
        return None

    def free(self) -> None:
        os.close(self.fd)  # closing the file releases its lock


class Lengths:
    """How long a job is expected to take: the longest COMPLETED job of its backbone in launcher.jsonl, every launch's
    into this sweep folder (read again as it grows, so a grid and its seeds launched side by side go by each other's
    runs), or in the record's runs (hydra.launcher.record: the folders of earlier leases may be gone); for a backbone
    with none, the median of the backbones' longest (their longest, PaTH's 1,900 s at 12 a GPU, kept every backbone
    not run yet from starting in a 27-minute lease: the median lets one start, and its own length counts once it
    ends); None with nothing to go by. (The backbone sets a run's cost in this repo's sweeps; its lr and seed hardly
    do.) Lengths are at this launch's sharing of a GPU, per_gpu: a record's run gives its gpu_s (its share of the
    GPU's seconds, scripts/results.py) times per_gpu, else its wall_s; a launcher.jsonl row its wall_s scaled from
    the row's per_gpu to this one's. (Taken as they were, the S2 PaTH runs' 1,900 s at 12 a GPU kept them from
    starting at 8, where they took 1,049-1,243 s.)"""

    def __init__(self, jsonl: Path, record_runs: Iterable[dict] = (), per_gpu: int = 1):
        self.jsonl, self.read_to, self.per_gpu = jsonl, 0, per_gpu
        self.longest: dict[str | None, float] = {}
        for r in record_runs:
            wall = r["gpu_s"] * per_gpu if r.get("gpu_s") else r.get("wall_s")
            if wall and r.get("backbone"):
                self._put(r["backbone"], wall)

    @staticmethod
    def kind(overrides: Sequence[str]) -> str | None:
        return next((o.partition("=")[2] for o in overrides if o.startswith("backbone=")), None)

    def _put(self, kind: str | None, seconds: float) -> None:
        self.longest[kind] = max(self.longest.get(kind, 0.0), seconds)

    def _read(self) -> None:
        """The rows launcher.jsonl gained since the last read (whole lines only: another launch may be writing one)."""
        if not self.jsonl.is_file():
            return
        with open(self.jsonl, "rb") as f:
            f.seek(self.read_to)
            new = f.read()
        new = new[:new.rfind(b"\n") + 1]
        self.read_to += len(new)
        for line in new.decode().splitlines():
            row = json.loads(line) if line.strip() else {}
            if row.get("status") == "COMPLETED":
                self._put(self.kind(row["overrides"]), row["wall_s"] * self.per_gpu / row.get("per_gpu", self.per_gpu))

    def expected(self, overrides: Sequence[str]) -> float | None:
        self._read()
        known = self.longest.get(self.kind(overrides))
        return known if known is not None else (statistics.median(self.longest.values()) if self.longest else None)


def summary(ended: dict[str, list], sweep_dir: Path, why_not: dict[Path, str] | None = None) -> str:
    """How the launch's jobs ended, and why the refused, waiting, not started and failed ones did not run (their
    `error:` lines, the launcher's reason for a waiting or not started job, e.g. "expected to take 1150 s, past
    finish_by"; grouped): Hydra would stop at the first failed job's exception, which names one job, not how many or
    why."""
    counts = ", ".join(f"{len(v)} {k.lower().replace('_', ' ')}" for k, v in sorted(ended.items()))
    lines = [f"{sum(map(len, ended.values()))} jobs: {counts} (each job: {sweep_dir / 'launcher.jsonl'})"]
    for status, said in (("REFUSED", "refused by the precheck"), ("WAITING", "waiting"),
                         ("NOT_STARTED", "not started"), ("FAILED", "failed with")):
        why: dict[str, int] = {}
        for job_dir in ended.get(status, []):
            line = (why_not or {}).get(job_dir) if status in ("WAITING", "NOT_STARTED") else \
                error_line(job_dir / "job.log")
            line = (line or "no error line (see the job's job.log)")[:160]
            why[line] = why.get(line, 0) + 1
        lines += [f"\t{n} {said}: {line}" for line, n in sorted(why.items(), key=lambda x: -x[1])[:8]]
        if len(why) > 8:
            lines.append(f"\t... and {len(why) - 8} other reasons (each job's job.log)")
    return "\n".join(lines)


def error_line(log: Path) -> str | None:
    """A job's last word on why it failed: train.py's one-line `error: ...`, else the last exception line."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    errors = [ln for ln in text.splitlines()
              if ln.startswith("error: ") or re.match(r"\w[\w.]*(Error|Exception): ", ln)]
    return errors[-1] if errors else None


def _wait(proc: subprocess.Popen, end: float | None, stop: threading.Event) -> tuple[int, bool]:
    """The job's exit code, and whether the deadline or a signal to the launcher stopped it: then it gets SIGTERM once
    (the trainer finishes its step, checkpoints and exits 0)."""
    while True:
        try:
            return proc.wait(timeout=1.0 if end is None else min(1.0, max(0.0, end - time.time()))), False
        except subprocess.TimeoutExpired:
            if stop.is_set() or (end is not None and time.time() >= end):
                proc.send_signal(signal.SIGTERM)
                return proc.wait(), True


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event):
    """While the launch runs, SIGTERM, SIGINT, SIGUSR1 or SIGHUP to the launcher sets `stop` (a stop, as the trainer
    takes each, not an exception): its running jobs then get SIGTERM (they checkpoint: PAUSED) and none starts, as at
    the deadline. Killed by the default handler instead (`timeout`, a `kill` of the launcher alone), the launcher left
    its jobs training with no one to stop them, and freed their GPU places (the locks went with it) to the next
    launch's jobs. A signal that is ignored (SIGHUP under nohup) stays ignored."""
    if threading.current_thread() is not threading.main_thread():  # handlers belong to the main thread
        yield
        return
    before = {}
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            before[sig] = signal.signal(sig, lambda signum, frame: stop.set())
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _function(name: str, option: str):
    """`package.module.function` -> the function (hydra.launcher.precheck, .ready)."""
    import importlib

    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"hydra.launcher.{option}={name}: no such function ({e})") from None


def _job_return(cfg: DictConfig, job_dir: Path, status: JobStatus, value) -> JobReturn:
    ret = JobReturn(cfg=cfg, hydra_cfg=cfg, working_dir=str(job_dir), task_name=cfg.hydra.job.name)
    ret.status, ret.return_value = status, value
    return ret


def record_runs(record: str | Path | None) -> dict[str, dict]:
    """A results record's runs (docs/results/<task>.json, scripts/results.py), by folder relative to the sweep's
    (`<backbone>-<pe>/lr<lr>-s<seed>`): each with its status (the launcher passes over those finished or diverged) and
    its wall time; none without a record or where the file is absent (a task's first launch)."""
    if record is None:
        return {}
    from hydra.utils import to_absolute_path

    path = Path(to_absolute_path(str(record)))
    return json.loads(path.read_text())["runs"] if path.is_file() else {}


def _relative(job_dir: Path, sweep_dir: Path) -> str:
    try:
        return job_dir.relative_to(sweep_dir).as_posix()
    except ValueError:
        return ""


def _passed_over(cfg: DictConfig, job_dir: Path, why: str) -> JobReturn:
    return _job_return(cfg, job_dir, JobStatus.COMPLETED, {"passed_over": why})


def visible_gpus() -> list[int | str]:
    """The GPUs this process may use, named as CUDA_VISIBLE_DEVICES names them: its entries where it is set (so a
    job given "2" runs on the machine's GPU 2 even when this process sees it as cuda:0), else 0..count-1."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [_gpu(g) for g in listed.split(",") if g.strip()]
    import torch

    return list(range(torch.cuda.device_count()))


def _gpu(g) -> int | str:
    """An index (0, "3") as an int; a UUID or MIG name ("GPU-5c6f...", "MIG-...") as given."""
    g = str(g).strip()
    return int(g) if g.isdigit() else g


def _read_return(payload: Path, rc: int, cfg: DictConfig, job_dir: Path) -> JobReturn:
    """The parent's JobReturn of a job: its config, and the status and return value the child reported (a failed
    one naming the exit code when the child died before reporting)."""
    import pickle

    done = payload.with_suffix(".ret")
    ret = JobReturn(cfg=cfg, hydra_cfg=cfg, working_dir=str(job_dir), task_name=cfg.hydra.job.name)
    try:
        ret.status, ret.return_value = pickle.loads(done.read_bytes())
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        ret.status = JobStatus.FAILED
        ret.return_value = RuntimeError(f"the job's process exited with code {rc} before reporting: {job_dir}/job.log")
    finally:
        payload.unlink(missing_ok=True)
        done.unlink(missing_ok=True)
    return ret


def _child(payload: Path) -> int:
    """In the job's process: Hydra's state as the parent had it, then the job as the basic launcher runs it; its
    status and return value go back (the value as text where it does not pickle)."""
    import pickle
    import traceback

    import torch

    hydra_context, task_function, cfg, state = pickle.loads(payload.read_bytes())
    print(f"[launcher] job {cfg.hydra.job.num}: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')} "
          f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} (torch: {torch.get_num_threads()})", flush=True)
    setup_globals()
    Singleton.set_state(state)
    ret = run_job(hydra_context=hydra_context, task_function=task_function, config=cfg,
                  job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    value = ret._return_value
    try:
        blob = pickle.dumps((ret.status, value))
    except Exception:
        failed = ret.status != JobStatus.COMPLETED
        blob = pickle.dumps((ret.status, RuntimeError(repr(value)) if failed else repr(value)))
    payload.with_suffix(".tmp").write_bytes(blob)
    payload.with_suffix(".tmp").replace(payload.with_suffix(".ret"))  # atomic: the parent never reads half a result
    if ret.status != JobStatus.COMPLETED:
        traceback.print_exception(value)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_child(Path(sys.argv[1])))
