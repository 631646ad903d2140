"""The results page's sweeps (issue #75): sweep=results_<task> (seed 0 over a learning-rate grid) and
results_<task>_seeds (seeds 1-2 at each pair's best, `${best_lr:val_acc}`: common/grid.py), run in pieces by
hydra/launcher=gpus (deadline, skip_done), collected by scripts/results.py into the page's tables. Here on the CPU,
with MQAR at a size that trains in seconds."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

from duality.common.errors import ConfigError
from duality.common.grid import best_lr

TINY = ["train.device=cpu", "logger=none", "model.d_model=32", "data.train_examples=256", "data.test_examples=32",
        "train.batch_size=64", "train.micro_batch=64", "train.epochs=1", "train.eval_interval=2",
        "train.progress=false", "hydra.launcher.gpus=[]", "hydra.launcher.per_gpu=2"]
NO_RECORD = "hydra.launcher.record=null"  # the results configs' record is the page's (docs/results/<task>.json)


def _sweep(sweep_dir, *args, timeout=600, record=None):
    """A tiny sweep, without the page's record unless one is given."""
    return subprocess.run([sys.executable, "train.py", "-m", *TINY, f"hydra.sweep.dir={sweep_dir}",
                           f"hydra.launcher.record={record}" if record else NO_RECORD, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _rows(sweep_dir):
    return [json.loads(x) for x in (sweep_dir / "launcher.jsonl").read_text().splitlines()]


def _grid_run(root, pair, lr, acc, loss):
    run = root / pair / f"lr{lr}-s0"
    run.mkdir(parents=True)
    (run / "task_eval.json").write_text(json.dumps({"config": {"optim": {"lr": lr}}, "val_acc": acc,
                                                    "val_loss": loss}))
    return run


def test_the_best_lr_is_the_grids_best_at_the_training_length_ties_to_the_lower_loss(tmp_path):
    _grid_run(tmp_path, "gla-rope", 0.001, 0.50, 1.0)
    _grid_run(tmp_path, "gla-rope", 0.003, 0.90, 0.4)
    _grid_run(tmp_path, "gla-rope", 0.01, 0.90, 0.3)
    assert best_lr(tmp_path, "gla-rope") == 0.01
    assert best_lr(tmp_path, "gla-rope", metric="val_loss") == 0.001  # any score the record holds, highest wins
    (tmp_path / "gla-rope" / "lr0.03-s0").mkdir()  # a grid run without a result: no choice yet
    with pytest.raises(ConfigError, match=r"gla-rope in .*: 1 of its grid runs have no task_eval.json \(lr0.03-s0"):
        best_lr(tmp_path, "gla-rope")
    with pytest.raises(ConfigError, match="fox-alibi .*no grid run of it finished"):
        best_lr(tmp_path, "fox-alibi")
    (tmp_path / "gla-rope" / "lr0.03-s0" / "job.log").write_text("...\nerror: pe=rope is refused\n")  # and why
    with pytest.raises(ConfigError, match=r"grid run lr0.03-s0 has no task_eval.json, and its job.log says: error: "
                                          r"pe=rope is refused$"):
        best_lr(tmp_path, "gla-rope")
    # a pair the sweep reached but whose grid is short of an lr other pairs ran (cut off before it started)
    _grid_run(tmp_path, "fox-nope", 0.001, 0.9, 0.1)
    _grid_run(tmp_path, "fox-nope", 0.003, 0.9, 0.1)
    with pytest.raises(ConfigError, match=r"fox-nope in .*: its grid lacks lr 0.01, 0.03 \(run by other pairs\)"):
        best_lr(tmp_path, "fox-nope")


def test_the_best_lr_reads_the_grid_from_the_record_where_the_folders_are_gone(tmp_path):
    """A results record (docs/results/<task>.json) holds each grid run's outcome: with the sweep folder lost (a new
    machine), the pair's lr is the record's choice; a folder's outcome joins or wins over the record's; an lr the
    record's grid names but the pair lacks keeps it waiting."""
    runs = {"gla-rope/lr0.001-s0": {"stage": "grid", "status": "finished", "lr": 0.001, "val_acc": 0.5, "val_loss": 1},
            "gla-rope/lr0.01-s0": {"stage": "grid", "status": "finished", "lr": 0.01, "val_acc": 0.9, "val_loss": 1},
            "gla-rope/best-s1": {"stage": "seeds", "status": "finished", "val_acc": 1.0, "val_loss": 0},
            "fox-nope/lr0.001-s0": {"stage": "grid", "status": "diverged", "lr": 0.001},
            "fox-nope/lr0.01-s0": {"stage": "grid", "status": "finished", "lr": 0.01, "val_acc": 0.2, "val_loss": 1},
            "path-nope/lr0.001-s0": {"stage": "grid", "status": "finished", "lr": 0.001, "val_acc": 0.2,
                                     "val_loss": 1},
            "path-nope/lr0.01-s0": {"stage": "grid", "status": "refused", "lr": 0.01}}
    record = tmp_path / "mqar.json"
    record.write_text(json.dumps({"runs": runs}))
    sweep = tmp_path / "sweep"
    assert best_lr(sweep, "gla-rope", record=record) == 0.01
    assert best_lr(sweep, "fox-nope", record=record) == 0.01  # the diverged lr ranks last, as from its folder
    with pytest.raises(ConfigError, match=r"path-nope in .*: its grid lacks lr 0.01"):
        best_lr(sweep, "path-nope", record=record)
    _grid_run(sweep, "path-nope", 0.01, 0.3, 1.0)  # run since, in the folder: the grid is whole, the best is it
    assert best_lr(sweep, "path-nope", record=record) == 0.01
    _grid_run(sweep, "gla-rope", 0.001, 0.95, 1.0)  # the folder's outcome wins over the record's for the same run
    assert best_lr(sweep, "gla-rope", record=record) == 0.001
    with pytest.raises(ConfigError, match="fox-nope .*no grid run of it finished"):
        best_lr(sweep, "fox-nope")  # without the record: the folder alone, as before


def _diverged(root, pair, name, step=1331):
    run = root / pair / name
    run.mkdir(parents=True, exist_ok=True)
    (run / "nonfinite.json").write_text(json.dumps({"step": step, "loss": 3.069, "grad_norm": float("inf"),
                                                    "where": "the forward and this rank's gradients are finite",
                                                    "message": f"step {step}: ..."}))


def test_a_diverged_grid_run_ranks_last_and_a_pair_diverged_at_every_lr_has_none(tmp_path):
    """A run train.nonfinite=stop ended leaves nonfinite.json (trainer/guard.py): an outcome of the grid, the
    worst lr, not a run still to finish."""
    _grid_run(tmp_path, "path-nope", 0.001, 0.10, 2.0)
    _diverged(tmp_path, "path-nope", "lr0.003-s0")
    assert best_lr(tmp_path, "path-nope") == 0.001
    _diverged(tmp_path, "gla-rope", "lr0.001-s0")
    _diverged(tmp_path, "gla-rope", "lr0.003-s0")
    with pytest.raises(ConfigError, match=r"gla-rope in .*: its run diverged at every lr of the grid \(0.001, 0.003;"):
        best_lr(tmp_path, "gla-rope")
    # one of them resumed by hand (train.nonfinite=skip) to the end: its result counts, the old nonfinite.json not
    (tmp_path / "gla-rope" / "lr0.003-s0" / "task_eval.json").write_text(json.dumps(
        {"config": {"optim": {"lr": 0.003}}, "val_acc": 0.2, "val_loss": 1.5}))
    assert best_lr(tmp_path, "gla-rope") == 0.003


def _finished(sweep, pair, name, lr, acc):
    run = sweep / pair / name
    run.mkdir(parents=True, exist_ok=True)
    (run / "task_eval.json").write_text(json.dumps({"config": {"optim": {"lr": lr}}, "step": 10, "tokens": 100,
                                                    "val_loss": 1 - acc, "val_acc": acc,
                                                    "curve": {"128": acc, "512": acc / 2}}))


def test_a_record_collected_over_sessions_chooses_no_lr_before_a_pairs_grid_is_whole(tmp_path, monkeypatch):
    """A sweep folder kept over device sessions, collected after each: a pair with part of its grid finished gets
    no lr (its cell says why), and each session counts only the runs it finished."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import results
    monkeypatch.setattr(results, "RECORDS", tmp_path / "records")
    sweep = tmp_path / "mqar"
    for lr, acc in ((0.001, 0.5), (0.01, 0.8)):
        _finished(sweep, "transformer-rope", f"lr{lr}-s0", lr, acc)
    _finished(sweep, "gla-rope", "lr0.001-s0", 0.001, 0.9)
    (sweep / "gla-rope" / "lr0.01-s0").mkdir()  # stopped when the session ended: no job.log error, no result
    meta = {"date": "d", "device": "x", "software": "s", "command": "c", "commit": "k"}
    rec = results.collect("mqar", sweep, meta)
    assert rec["chosen_lr"] == {"transformer-rope": 0.01}
    assert rec["sessions"][-1]["finished"] == 3
    assert results.cell(rec, "transformer", "rope", "at 128 (trained)") == "80.0 (1 seed)"
    assert results.cell(rec, "gla", "rope", "at 128 (trained)") == "not finished"
    # next session: gla's second lr finishes (better), and a seed of the transformer
    _finished(sweep, "gla-rope", "lr0.01-s0", 0.01, 0.95)
    _finished(sweep, "transformer-rope", "best-s1", 0.01, 0.7)
    rec = results.collect("mqar", sweep, meta)
    assert rec["chosen_lr"] == {"gla-rope": 0.01, "transformer-rope": 0.01}
    assert [x["finished"] for x in rec["sessions"]] == [3, 2]
    assert [x["pairs"] - x["refused"] for x in rec["sessions"]] == [2, 2]  # the pairs each session finished runs of
    assert results.cell(rec, "transformer", "rope", "at 128 (trained)") == "75.0 ± 7.1 (2 seeds)"
    # a pair with a finished grid run but another lr never started reads as an unfinished grid, with no lr
    _finished(sweep, "fox-rope", "lr0.001-s0", 0.001, 0.9)
    rec = results.collect("mqar", sweep, meta)
    assert "fox-rope" not in rec["chosen_lr"] and rec["sessions"][-1]["pairs"] == 1  # fox alone, not the folder's 3
    assert results.cell(rec, "fox", "rope", "at 128 (trained)") == "grid not finished"


def test_a_pair_another_tasks_record_has_refused_is_refused_before_its_own_sweep_reaches_it(tmp_path, monkeypatch):
    """A refusal is the model's (a scheme the backbone cannot use), the same on every task: a task whose sweep has not
    asked yet says so from another task's record, and "not run" stays for pairs nobody refused."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import results
    monkeypatch.setattr(results, "RECORDS", tmp_path / "records")
    meta = {"date": "d", "device": "x", "software": "s", "command": "c", "commit": "k"}
    refused = tmp_path / "mqar" / "gla-alibi" / "lr0.001-s0"
    refused.mkdir(parents=True)
    (refused / "job.log").write_text("error: pe=alibi is a score scheme, which backbone=gla cannot use (it accepts "
                                     "none/absolute/rotary schemes)\n")
    _finished(tmp_path / "mqar", "gla-rope", "lr0.001-s0", 0.001, 0.5)
    results.collect("mqar", tmp_path / "mqar", meta)
    run = tmp_path / "s2" / "transformer-rope" / "lr0.001-s0"
    run.mkdir(parents=True)
    (run / "task_eval.json").write_text(json.dumps({"config": {"optim": {"lr": 0.001}}, "step": 10, "tokens": 100,
                                                    "val_loss": 0.5, "val_acc": 0.9, "val_acc_extrap": 0.5}))
    s2 = results.collect("s2", tmp_path / "s2", meta)
    assert results.cell(s2, "gla", "alibi", "<= 128 (trained)") == "refused: score scheme"
    assert results.cell(s2, "gla", "rope", "<= 128 (trained)") == "not run"  # finished elsewhere: not refused


def test_a_record_says_which_runs_diverged_and_chooses_around_them(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts"))
    import results
    monkeypatch.setattr(results, "RECORDS", tmp_path / "records")
    sweep = tmp_path / "mqar"
    _finished(sweep, "path-nope", "lr0.001-s0", 0.001, 0.5)
    _diverged(sweep, "path-nope", "lr0.01-s0")
    _finished(sweep, "path-nope", "best-s1", 0.001, 0.7)
    _diverged(sweep, "path-nope", "best-s2", step=40)
    _diverged(sweep, "gla-rope", "lr0.001-s0")
    _diverged(sweep, "gla-rope", "lr0.01-s0")
    rec = results.collect("mqar", sweep, {"date": "d", "device": "x", "software": "s", "command": "c", "commit": "k"})
    assert rec["chosen_lr"] == {"path-nope": 0.001}
    assert rec["runs"]["path-nope/lr0.01-s0"] | {"lr": 0} == {
        "backbone": "path", "pe": "nope", "seed": 0, "stage": "grid", "status": "diverged", "step": 1331, "lr": 0,
        "reason": "step 1,331: loss 3.069, gradient norm inf"}
    assert rec["sessions"][-1]["finished"] == 2  # diverged runs are not counted as finished
    assert results.cell(rec, "path", "nope", "at 128 (trained)") == "60.0 ± 14.1 (2 seeds, 1 diverged)"
    assert results.cell(rec, "gla", "rope", "at 128 (trained)") == "diverged at every lr"
    assert "Diverged grid runs (`train.nonfinite=stop` ended them; each counts as its pair's worst lr): gla-rope at " \
        "0.001 (step 1,331: loss 3.069, gradient norm inf); gla-rope at 0.01 (step 1,331: loss 3.069, gradient norm " \
        "inf); path-nope at 0.01 (step 1,331: loss 3.069, gradient norm inf)." in results.table("mqar")


@pytest.mark.slow
def test_a_results_sweep_refuses_pairs_in_cells_passes_over_done_runs_and_trains_seeds_at_the_best_lr(
        tmp_path, monkeypatch):
    sweep = tmp_path / "mqar"
    pairs = ["backbone=transformer,gla", "pe=alibi"]  # gla + ALiBi: refused by the model, a cell with its reason
    # seeds before the grid: the accepted pair's job waits for it (hydra.launcher.ready), no folder, no failure
    r = _sweep(sweep, "sweep=results_mqar_seeds", *pairs, "seed=1")
    assert r.returncode == 0 and "[hydra] 2 jobs: 1 refused, 1 waiting" in r.stdout, r.stdout[-2000:] + r.stderr
    assert "\t1 waiting: best_lr: transformer-alibi in " in r.stdout and "no grid run of it finished" in r.stdout
    assert sorted(x["status"] for x in _rows(sweep)) == ["REFUSED", "WAITING"]
    assert not (sweep / "transformer-alibi").exists()
    r = _sweep(sweep, "sweep=results_mqar", *pairs, "optim.lr=1e-3,1e-2")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]  # a refusal is no failure
    rows = _rows(sweep)[2:]
    assert sorted((x["overrides"][0], x["status"]) for x in rows) == [
        ("backbone=gla", "REFUSED"), ("backbone=gla", "REFUSED"),
        ("backbone=transformer", "COMPLETED"), ("backbone=transformer", "COMPLETED")]
    log = (sweep / "gla-alibi" / "lr0.001-s0" / "job.log").read_text()
    assert "error: pe=alibi is a score scheme, which backbone=gla cannot use" in log
    assert "[launcher] job" not in log  # refused by the launcher's precheck: no process was started for it
    # the launcher's last word says how the jobs ended and why the refused ones were (Hydra names one job only)
    assert "[hydra] 4 jobs: 2 completed, 2 refused" in r.stdout
    assert "\t2 refused by the precheck: error: pe=alibi is a score scheme, which backbone=gla cannot use" in r.stdout
    scores = {lr: json.loads((sweep / "transformer-alibi" / f"lr{lr}-s0" / "task_eval.json").read_text())
              for lr in ("0.001", "0.01")}
    assert all(set(s["curve"]) == {"128", "512"} for s in scores.values())  # scored at 1x and 4x the length

    # the same command again: the finished runs are passed over, not retrained, and so is a run that diverged
    _diverged(sweep, "gla-alibi", "lr0.001-s0")  # as trainer/guard.py leaves it (tests/test_memory.py)
    r = _sweep(sweep, "sweep=results_mqar", *pairs, "optim.lr=1e-3,1e-2")
    again = {(x["overrides"][0], next(o for o in x["overrides"] if o.startswith("optim.lr="))): x["status"]
             for x in _rows(sweep)[2 + len(rows):]}
    assert again == {("backbone=transformer", "optim.lr=0.001"): "DONE_BEFORE",
                     ("backbone=transformer", "optim.lr=0.01"): "DONE_BEFORE",
                     ("backbone=gla", "optim.lr=0.001"): "DONE_BEFORE", ("backbone=gla", "optim.lr=0.01"): "REFUSED"}

    # seed 1 at the grid's best lr; the refused pair's seed is refused as its grid runs were, not sent to the grid
    r = _sweep(sweep, "sweep=results_mqar_seeds", *pairs, "seed=1")
    best = max(scores, key=lambda lr: (scores[lr]["val_acc"], -scores[lr]["val_loss"]))
    seeded = json.loads((sweep / "transformer-alibi" / "best-s1" / "task_eval.json").read_text())
    assert seeded["config"]["optim"]["lr"] == float(best) and seeded["config"]["seed"] == 1
    log = (sweep / "gla-alibi" / "best-s1" / "job.log").read_text()
    assert "error: pe=alibi is a score scheme, which backbone=gla cannot use" in log and "best_lr" not in log

    # collected: the accepted pair's cell over its 2 seeds, the refused pair's cell says why
    sys.path.insert(0, str(ROOT / "scripts"))
    import results
    monkeypatch.setattr(results, "RECORDS", tmp_path / "records")
    rec = results.collect("mqar", sweep, {"date": "d", "device": "cpu", "software": "s", "command": "c",
                                          "commit": "x"})
    assert rec["chosen_lr"] == {"transformer-alibi": float(best)}
    table = results.table("mqar")
    accs = [100 * s["curve"]["128"] for s in (scores[best], seeded)]
    mean = sum(accs) / 2
    alibi = results.SCHEMES.index("alibi") + 1  # the sweep's schemes are the columns, after the backbone's name
    row = next(x for x in table.splitlines() if x.startswith("| transformer |"))
    assert row.strip(" |").split(" | ")[alibi] == f"{mean:.1f} ± {abs(accs[0] - accs[1]) / 2 ** 0.5:.1f} (2 seeds)"
    assert next(x for x in table.splitlines() if x.startswith("| gla |")).strip(" |").split(" | ")[alibi] == \
        "refused: score scheme"
    assert results.plot("mqar").stat().st_size > 10_000


@pytest.mark.slow
def test_a_results_sweep_continues_from_its_record_where_its_folders_are_gone(tmp_path, monkeypatch):
    """hydra.launcher.record (the seeds configs set docs/results/<task>.json): the runs a record holds as over are
    passed over with no folder made, and the seeds train at the lr the record chose, in a sweep folder that is new
    (the earlier one lost with its machine)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import results
    monkeypatch.setattr(results, "RECORDS", tmp_path / "records")
    grid = ["sweep=results_mqar", "backbone=transformer", "pe=nope,rope", "optim.lr=1e-3,1e-2"]
    r = _sweep(tmp_path / "first", *grid)
    assert r.returncode == 0, r.stderr[-2000:]
    rec = results.collect("mqar", tmp_path / "first", {"date": "d", "device": "cpu", "software": "s", "command": "c",
                                                       "commit": "x"})
    record = results.record_path("mqar")
    chosen = rec["chosen_lr"]["transformer-rope"]
    rec["runs"][f"transformer-rope/lr{chosen}-s0"].update(status="diverged")  # an outcome too, and now the worst
    record.write_text(json.dumps(rec))
    sweep = tmp_path / "new"
    r = _sweep(sweep, "sweep=results_mqar", "backbone=transformer,gla", "pe=rope", "optim.lr=1e-3,1e-2",
               record=record)
    assert r.returncode == 0, r.stderr[-2000:]
    status = {(o["backbone"], o["optim.lr"]): x["status"]
              for x in _rows(sweep) for o in [dict(v.split("=", 1) for v in x["overrides"])]}
    assert status == {("transformer", "0.001"): "DONE_BEFORE", ("transformer", "0.01"): "DONE_BEFORE",
                      ("gla", "0.001"): "COMPLETED", ("gla", "0.01"): "COMPLETED"}
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["gla-rope"]
    r = _sweep(sweep, "sweep=results_mqar_seeds", "backbone=transformer,gla", "pe=rope", "seed=1", record=record)
    assert r.returncode == 0, r.stderr[-2000:]
    seeded = json.loads((sweep / "transformer-rope" / "best-s1" / "task_eval.json").read_text())
    assert seeded["config"]["optim"]["lr"] == ({0.001, 0.01} - {chosen}).pop()  # the record's grid, as it now reads
    gla = {lr: json.loads((sweep / "gla-rope" / f"lr{lr}-s0" / "task_eval.json").read_text()) for lr in (0.001, 0.01)}
    best = max(gla, key=lambda lr: (gla[lr]["val_acc"], -gla[lr]["val_loss"]))  # from the new folder alone
    assert json.loads((sweep / "gla-rope" / "best-s1" / "task_eval.json").read_text())["config"]["optim"]["lr"] == best


@pytest.mark.slow
def test_a_sweeps_deadline_checkpoints_the_running_jobs_and_starts_no_more(tmp_path):
    """hydra.launcher.deadline: the running job gets SIGTERM, finishes its step, checkpoints and exits 0 (resume=auto
    goes on from there); the job still waiting is not started."""
    sweep = tmp_path / "long"
    r = _sweep(sweep, "sweep=results_mqar", "backbone=transformer", "pe=nope,rope", "optim.lr=1e-3",
               "hydra.launcher.per_gpu=1", "hydra.launcher.deadline=40", "train.epochs=10000")
    assert r.returncode == 0, r.stderr[-2000:]
    status = {x["overrides"][1]: x for x in _rows(sweep)}
    assert (status["pe=nope"]["status"], status["pe=nope"]["returncode"]) == ("PAUSED", 0)
    assert status["pe=rope"]["status"] == "NOT_STARTED" and not (sweep / "transformer-rope").exists()
    log = (sweep / "transformer-nope" / "lr0.001-s0" / "job.log").read_text()
    assert "SIGTERM: stopped after this step: checkpointed" in log
    assert (sweep / "transformer-nope" / "lr0.001-s0" / "checkpoints" / "latest").exists()


@pytest.mark.slow
def test_a_signal_to_the_launcher_checkpoints_its_running_job_and_starts_no_more(tmp_path):
    """SIGTERM to the launcher alone (`timeout`, `kill`): as at the deadline, its running job checkpoints and exits 0
    (PAUSED), the waiting one is not started, the launcher says so and exits 0, and no job process is left. Before,
    the launcher died at once (-15) and its job trained on with no one to stop it."""
    import signal
    sweep = tmp_path / "signalled"
    proc = subprocess.Popen([sys.executable, "train.py", "-m", *TINY, f"hydra.sweep.dir={sweep}", NO_RECORD,
                             "sweep=results_mqar", "backbone=transformer", "pe=nope,rope", "optim.lr=1e-3",
                             "hydra.launcher.per_gpu=1", "train.epochs=10000"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = sweep / "transformer-nope" / "lr0.001-s0"
    t0 = time.time()
    while not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text().strip()):  # it trains
        assert proc.poll() is None and time.time() - t0 < 300, proc.stderr.read()[-2000:]
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    status = {x["overrides"][1]: x for x in _rows(sweep)}
    assert (status["pe=nope"]["status"], status["pe=nope"]["returncode"]) == ("PAUSED", 0)
    assert status["pe=rope"]["status"] == "NOT_STARTED" and not (sweep / "transformer-rope").exists()
    assert "SIGTERM: stopped after this step: checkpointed" in (run / "job.log").read_text()
    assert (run / "checkpoints" / "latest").exists() and "stopped by a signal" in out + err
    def cmdline(pid_dir):
        try:
            return (pid_dir / "cmdline").read_bytes().decode(errors="replace")
        except OSError:  # a process that has just ended
            return ""
    assert [p for p in Path("/proc").glob("[0-9]*") if str(sweep) in cmdline(p)] == []  # a job names its payload


@pytest.mark.slow
def test_a_sweeps_start_by_lets_the_running_job_finish_and_starts_no_more(tmp_path):
    """hydra.launcher.start_by (a lease's end): the job running then finishes, the one waiting is not started (3 s
    from the launcher's start: the first job starts within it, the second after the first's several seconds)."""
    sweep = tmp_path / "short"
    r = _sweep(sweep, "sweep=results_mqar", "backbone=transformer", "pe=nope,rope", "optim.lr=1e-3",
               "hydra.launcher.per_gpu=1", "hydra.launcher.start_by=3")
    assert r.returncode == 0, r.stderr[-2000:]
    status = {x["overrides"][1]: x for x in _rows(sweep)}
    assert (status["pe=nope"]["status"], status["pe=nope"]["wall_s"] > 1) == ("COMPLETED", True)
    assert status["pe=nope"]["per_gpu"] == 1  # its sharing, which finish_by scales its wall_s from
    assert (sweep / "transformer-nope" / "lr0.001-s0" / "task_eval.json").exists()
    assert status["pe=rope"]["status"] == "NOT_STARTED" and not (sweep / "transformer-rope").exists()
    assert "\t1 not started: no time to start\n" in r.stdout + r.stderr


@pytest.mark.slow
def test_a_sweeps_clock_starts_with_the_launcher_before_hydra_checks_every_jobs_config(tmp_path):
    """start_by (and deadline, finish_by) count from the launcher's start: Hydra's sweeper then composes each of the
    72 jobs' configs to check them (several seconds) before the launch, so with start_by=2 no job starts (counted
    from the launch, every accepted one would have)."""
    sweep = tmp_path / "late"
    r = _sweep(sweep, "sweep=results_mqar", "backbone=transformer,fox,gla,deltanet,retnet,mamba2",
               "pe=nope,rope,selective_rope,alibi", "hydra.launcher.start_by=2")
    assert r.returncode == 0, r.stderr[-2000:]  # the refused pairs' jobs are refused (the precheck), none starts
    status = [x["status"] for x in _rows(sweep)]
    assert len(status) == 72 and set(status) == {"NOT_STARTED", "REFUSED"} and status.count("REFUSED") == 15


@pytest.mark.slow
def test_a_sweeps_finish_by_passes_over_a_job_expected_to_end_past_it_and_starts_the_next(tmp_path):
    """hydra.launcher.finish_by (a lease's end): GLA took 5,000 s before (launcher.jsonl), so with 600 s left its job
    is not started, and the transformer's (2 s before), next in the queue, runs."""
    sweep = tmp_path / "fit"
    sweep.mkdir()
    before = [{"job": 0, "overrides": ["backbone=gla", "pe=nope"], "status": "COMPLETED", "wall_s": 5000.0},
              {"job": 1, "overrides": ["backbone=transformer", "pe=rope"], "status": "COMPLETED", "wall_s": 2.0}]
    (sweep / "launcher.jsonl").write_text("".join(json.dumps(x) + "\n" for x in before))
    r = _sweep(sweep, "sweep=results_mqar", "backbone=gla,transformer", "pe=nope", "optim.lr=1e-3",
               "hydra.launcher.per_gpu=1", "hydra.launcher.finish_by=600")
    assert r.returncode == 0, r.stderr[-2000:]
    assert {x["overrides"][0]: x["status"] for x in _rows(sweep)[2:]} == {"backbone=gla": "NOT_STARTED",
                                                                           "backbone=transformer": "COMPLETED"}
    assert not (sweep / "gla-nope").exists() and (sweep / "transformer-nope" / "lr0.001-s0" / "task_eval.json").exists()
    assert "\t1 not started: expected to take 5000 s, past finish_by\n" in r.stdout + r.stderr  # the summary says why


@pytest.mark.slow
def test_two_launches_into_one_sweep_folder_at_once_each_run_their_own_jobs(tmp_path):
    """A task's grid and seeds side by side (a GPU each) launch into one sweep folder: a launch's jobs get their own
    configs, never the other launch's, and none loses its own (each launch keeps its payloads apart)."""
    sweep = tmp_path / "both"
    both = ["sweep=results_mqar", "backbone=transformer", "pe=nope", "hydra.launcher.per_gpu=1",
            "hydra.sweep.subdir=lr${optim.lr}-e${train.epochs}"]
    first = subprocess.Popen([sys.executable, "train.py", "-m", *TINY, f"hydra.sweep.dir={sweep}", *both, NO_RECORD,
                              "optim.lr=1e-3", "train.epochs=20,1"], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        while not (sweep / "lr0.001-e20" / "job.log").exists():  # its second job waits, its payload written
            assert first.poll() is None, first.stdout.read()[-2000:]
            time.sleep(0.2)
        second = _sweep(sweep, *both, "optim.lr=3e-3", "train.epochs=1,2")
        out, _ = first.communicate(timeout=600)
    finally:
        first.kill()
    assert first.returncode == 0 and second.returncode == 0, out[-2000:] + second.stderr[-2000:]
    assert (sweep / "lr0.001-e20" / "task_eval.json").exists(), "the first launch's running job was overtaken"
    for lr, epochs in ((0.001, 1), (0.003, 1), (0.003, 2)):
        run = json.loads((sweep / f"lr{lr}-e{epochs}" / "task_eval.json").read_text())["config"]
        assert (run["optim"]["lr"], run["train"]["epochs"]) == (lr, epochs)
    assert sorted(x["status"] for x in _rows(sweep)) == ["COMPLETED"] * 4


@pytest.mark.slow
def test_a_launch_says_every_job_dealt_once_each_runs_or_waits_for_a_place(tmp_path):
    """The line scripts/results_sweeps.sh starts the next launch on: with one place (one GPU at per_gpu=1) and two
    jobs, it comes once the first job has ended and the second is dealt, not at the launch's start, where the next
    launch's job could take the place meant for the second."""
    sweep = tmp_path / "one"
    r = _sweep(sweep, "sweep=results_mqar", "backbone=transformer", "pe=nope,rope", "optim.lr=1e-3",
               "hydra.launcher.gpus=[7]", "hydra.launcher.per_gpu=1", f"hydra.launcher.slots_dir={tmp_path / 's'}")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = (r.stdout + r.stderr).splitlines()
    at = {key: [i for i, line in enumerate(lines) if key in line] for key in ("#0 on GPU 7", "every job dealt",
                                                                           "#1 on GPU 7")}
    assert [len(v) for v in at.values()] == [1, 1, 1], at
    assert at["#0 on GPU 7"] < at["every job dealt"] < at["#1 on GPU 7"], lines
    first, second = sorted((x["start"], x["start"] + x["wall_s"]) for x in _rows(sweep))
    assert second[0] >= first[1] - 0.002  # one place: the second began when the first ended


def test_a_gpus_places_are_shared_by_the_launches_on_the_machine(tmp_path):
    from hydra_plugins.duality_launcher.gpus import Slot
    a, b = Slot.take(tmp_path, [3], per_gpu=2), Slot.take(tmp_path, [3], per_gpu=2)
    assert a.gpu == b.gpu == 3 and Slot.take(tmp_path, [5], per_gpu=2).gpu == 5  # another GPU's places are its own
    t = time.time()
    assert Slot.take(tmp_path, [3], per_gpu=2, until=t + 0.5, poll=0.1) is None and time.time() - t >= 0.5  # full
    assert Slot.take(tmp_path, [3], per_gpu=3, until=t + 1)  # a launch with more places a GPU has a free one
    b.free()
    assert Slot.take(tmp_path, [3], per_gpu=2, until=time.time() + 1).gpu == 3  # freed: taken again
    assert Slot.take(tmp_path, [], per_gpu=1) is None  # the CPU: no places to take


def test_a_job_takes_a_place_on_the_gpu_with_the_most_free_not_a_fixed_one(tmp_path):
    """Launches side by side each dealt their jobs to the GPUs in turn from GPU 0, and a job bound to a full GPU 0
    waited while the other GPUs had places (2026-11-30, 4 x H200: one waited 17 minutes, then could not start)."""
    from hydra_plugins.duality_launcher.gpus import Slot
    held = [Slot.take(tmp_path, [0], per_gpu=3) for _ in range(3)]  # another launch fills GPU 0
    t = time.time()
    taken = [Slot.take(tmp_path, [0, 1, 2], per_gpu=3, until=t + 5, poll=0.1) for _ in range(4)]
    assert time.time() - t < 1 and [s.gpu for s in taken] == [1, 2, 1, 2]  # none waits on GPU 0; 1 and 2 evenly
    held[0].free()  # GPU 0: 1 free, GPU 1 and 2 1 each: a tie goes in the GPUs' order
    assert [Slot.take(tmp_path, [0, 1, 2], per_gpu=3).gpu for _ in range(3)] == [0, 1, 2]
    assert Slot.take(tmp_path, [0, 1, 2], per_gpu=3, until=time.time() + 0.3, poll=0.1) is None  # all 9 taken


@pytest.mark.slow
def test_two_launches_on_one_gpu_run_per_gpu_jobs_at_once_together(tmp_path):
    """Two sweeps launched side by side on one GPU with per_gpu=1 run one job at a time between them (before, each
    ran its own per_gpu: the GPU ran two)."""
    args = ["sweep=results_mqar", "backbone=transformer", "pe=nope,rope", "hydra.launcher.gpus=[7]",
            "hydra.launcher.per_gpu=1", f"hydra.launcher.slots_dir={tmp_path / 'slots'}"]
    first = subprocess.Popen([sys.executable, "train.py", "-m", *TINY, f"hydra.sweep.dir={tmp_path / 'a'}", NO_RECORD,
                              *args, "optim.lr=1e-3"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        second = _sweep(tmp_path / "b", *args, "optim.lr=3e-3")
        out, _ = first.communicate(timeout=600)
    finally:
        first.kill()
    assert first.returncode == 0 and second.returncode == 0, out[-2000:] + second.stderr[-2000:]
    jobs = sorted((x["start"], x["start"] + x["wall_s"], x["status"]) for d in "ab" for x in _rows(tmp_path / d))
    assert [j[2] for j in jobs] == ["COMPLETED"] * 4
    # one at a time: each starts after the one before ended (launcher.jsonl rounds start and wall time to 1 ms each, and
    # a launch's next job starts within a millisecond of its last; without the places they overlap by seconds)
    assert all(later[0] >= earlier[1] - 0.002 for earlier, later in zip(jobs, jobs[1:])), jobs


def test_a_jobs_expected_length_is_the_longest_completed_of_its_backbone_else_the_median_backbones(tmp_path):
    """hydra.launcher.finish_by's estimate: launcher.jsonl's completed jobs, read again as the file grows (a launch
    beside this one writes it too), and the record's runs (earlier leases' folders gone), each at the launch's
    per_gpu: gpu_s times it, else wall_s. A backbone not run yet goes by the median backbone's longest, not the
    longest's (which kept the S2 grid's GLA, DeltaNet, Gated DeltaNet and gated Oja runs behind PaTH's in every
    lease)."""
    from hydra_plugins.duality_launcher.gpus import Lengths
    jsonl = tmp_path / "launcher.jsonl"
    lengths = Lengths(jsonl)
    assert lengths.expected(["backbone=gla"]) is None  # nothing to go by: the job starts

    def rows(*rs):
        return "".join(json.dumps({"overrides": [f"backbone={b}", "seed=0"], "status": s, "wall_s": w}) + "\n"
                       for b, s, w in rs)
    jsonl.write_text(rows(("gla", "COMPLETED", 100.0), ("gla", "COMPLETED", 300.0), ("gla", "FAILED", 900.0),
                          ("path", "PAUSED", 1000.0), ("transformer", "COMPLETED", 50.0), ("path", "DONE_BEFORE", 0.0)))
    assert [lengths.expected([f"backbone={b}", "seed=1"]) for b in ("gla", "transformer", "path")] == [300, 50, 175]
    with open(jsonl, "a") as f:  # another launch's job completed since, and a third's row is half written
        f.write(rows(("path", "COMPLETED", 1050.0)) + rows(("sympow", "COMPLETED", 2000.0))[:30])
    assert lengths.expected(["backbone=path"]) == 1050 and lengths.expected(["backbone=sympow"]) == 300
    with open(jsonl, "a") as f:
        f.write(rows(("sympow", "COMPLETED", 2000.0))[30:])
    assert lengths.expected(["backbone=sympow"]) == 2000
    # at this launch's sharing: a record's gpu_s times per_gpu before its wall_s (run at 12 a GPU, say), a row's
    # wall_s scaled from its per_gpu (rows written before it had one: as they are)
    record = [{"backbone": "mamba2", "wall_s": 700.0, "gpu_s": 60.0}, {"backbone": "retnet", "gpu_s": 50.0},
              {"backbone": "retnet", "gpu_s": 40.0}, {"backbone": "gla", "status": "refused"},
              {"backbone": "fox", "wall_s": 650.0}]
    jsonl.write_text(json.dumps({"overrides": ["backbone=path"], "status": "COMPLETED", "wall_s": 1800.0,
                                 "per_gpu": 12}) + "\n")
    lengths = Lengths(jsonl, record, per_gpu=8)
    assert [lengths.expected([f"backbone={b}"]) for b in ("mamba2", "retnet", "fox", "path", "gla")] == \
        [480, 400, 650, 1200, 565]
    with open(jsonl, "a") as f:  # a row from before rows had per_gpu: its wall_s as it is, whatever the launch's
        f.write(json.dumps({"overrides": ["backbone=linear_attn"], "status": "COMPLETED", "wall_s": 900.0}) + "\n")
    assert lengths.expected(["backbone=linear_attn"]) == 900


@pytest.mark.slow
def test_the_seeds_sweep_run_as_one_run_says_what_to_do(tmp_path):
    """Without -m there is no grid to read the lr from: one line that says to run it as a sweep, not a traceback
    (nor a run at the lr of whatever outputs/results the current folder holds)."""
    r = subprocess.run([sys.executable, str(ROOT / "train.py"), "sweep=results_mqar_seeds", "train.device=cpu",
                        "logger=none"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: optim.lr=${best_lr:...} is a results sweep's seeds' learning rate, read from its grid's runs: run it "
        "as a sweep (python train.py -m sweep=results_<task>_seeds), or give optim.lr"], r.stderr[-2000:]


def test_a_rerun_is_compared_run_by_run_with_the_record(tmp_path, monkeypatch, capsys):
    sys.path.insert(0, str(ROOT / "scripts"))
    import results
    monkeypatch.setattr(results, "RECORDS", tmp_path / "records")
    first, again = tmp_path / "first", tmp_path / "again"
    _finished(first, "gla-rope", "lr0.001-s0", 0.001, 0.50)
    _finished(first, "gla-rope", "lr0.01-s0", 0.01, 0.90)
    results.collect("mqar", first, {"date": "d", "device": "x", "software": "s", "command": "c", "commit": "k"})
    _finished(again, "gla-rope", "lr0.001-s0", 0.001, 0.52)
    _finished(again, "fox-rope", "lr0.001-s0", 0.001, 0.7)  # not in the record: not compared
    assert results.main(["compare", "mqar", str(again), "--json", str(tmp_path / "cmp.json")]) == 0
    rows = json.loads((tmp_path / "cmp.json").read_text())
    assert [(x["run"], x["point"]) for x in rows] == [("gla-rope/lr0.001-s0", "at 128 (trained)"),
                                                      ("gla-rope/lr0.001-s0", "at 512 (4x)")]
    assert [round(x["diff"], 6) for x in rows] == [2.0, 1.0]  # 52 - 50; 26 - 25
    assert "1 run compared; largest difference +2.0 points (gla-rope/lr0.001-s0, at 128 (trained))" in \
        capsys.readouterr().out


def test_a_recorded_rerun_is_the_pages_rerun_line(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts"))
    import results
    monkeypatch.setattr(results, "RECORDS", tmp_path / "records")
    first, again = tmp_path / "first", tmp_path / "again"
    for sweep, acc in ((first, 0.50), (again, 0.50)):
        _finished(sweep, "gla-rope", "lr0.001-s0", 0.001, acc)
        _finished(sweep, "gla-nope", "lr0.001-s0", 0.001, acc + 0.1)
    results.collect("mqar", first, {"date": "d", "device": "x", "software": "s", "command": "c", "commit": "k0"})
    assert results.rerun_summary() == "- Not run yet."
    with pytest.raises(SystemExit, match="compare --record needs --device, --commit"):
        results.main(["compare", "mqar", str(again), "--record", "--date", "2026-11-29", "--command", "c"])
    assert not results.rerun_path("mqar").exists()
    assert results.main(["compare", "mqar", str(again), "--record", "--date", "2026-11-29", "--device", "H200",
                         "--command", "python train.py -m sweep=results_mqar", "--commit", "k1"]) == 0
    assert results.rerun_summary() == (
        "- MQAR (128, 8), 2026-11-29, H200, a clean checkout of k1: `python train.py -m sweep=results_mqar`, 2 runs "
        "(2 pairs: gla-nope, gla-rope) against the record's (code k0): largest difference +0.0 points "
        "(gla-nope/lr0.001-s0, at 128 (trained)), mean |difference| 0.00; validation loss bit for bit equal in 2 of "
        "2 runs, the largest gap 0.")


def test_retrievals_families_are_a_table_of_the_runs_that_recorded_them(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts"))
    import results
    monkeypatch.setattr(results, "RECORDS", tmp_path / "records")
    sweep = tmp_path / "retrieval"

    def finished(pair, name, acc, families=None):
        run = sweep / pair / name
        run.mkdir(parents=True)
        r = {"config": {"optim": {"lr": 0.001}}, "step": 10, "tokens": 100, "val_loss": 1 - acc, "val_acc": acc,
             "curve": {str(n): acc for n in (512, 2048, 8192, 32768)}}
        (run / "task_eval.json").write_text(json.dumps(r | ({"curve_family": families} if families else {})))
    finished("deltanet-nope", "lr0.001-s0", 0.8, {"passkey": {"512": 1.0, "2048": 1.0},
                                                  "niah_multikey": {"512": 0.5, "2048": 0.25}})
    finished("deltanet-nope", "best-s1", 0.9, {"passkey": {"512": 1.0, "2048": 0.5},
                                               "niah_multikey": {"512": 0.0, "2048": 0.25}})
    finished("deltanet-nope", "best-s2", 0.9)  # a run from before the families were recorded
    finished("transformer-nope", "lr0.001-s0", 0.6)
    results.collect("retrieval", sweep, {"date": "d", "device": "x", "software": "s", "command": "c", "commit": "k"})
    table = results.table("retrieval")
    assert "| pair | runs | passkey | niah_multikey |" in table
    assert "| deltanet + nope | 2 | 100 / 75 | 25 / 25 |" in table and "| transformer + nope |" not in table


def test_a_cell_is_the_mean_and_sd_of_its_seeds_at_the_chosen_lr_or_says_why_it_has_none(tmp_path, monkeypatch):
    """The table from a record written by hand: seed 0 at the grid's chosen lr (not the other grid run) with seeds
    1 and 2; a refused pair, a failed one and a pair never run each say so."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import results
    monkeypatch.setattr(results, "RECORDS", tmp_path)

    def run(pe, name, seed, lr, acc, stage):
        return {f"gla-{pe}/{name}": {"backbone": "gla", "pe": pe, "seed": seed, "stage": stage, "status": "finished",
                                     "lr": lr, "val_loss": 1.0, "scores": {"at 128 (trained)": acc,
                                                                            "at 512 (4x)": acc / 2}}}
    runs = {**run("rope", "lr0.001-s0", 0, 1e-3, 0.50, "grid"), **run("rope", "lr0.01-s0", 0, 1e-2, 0.90, "grid"),
            **run("rope", "best-s1", 1, 1e-2, 0.95, "seeds"), **run("rope", "best-s2", 2, 1e-2, 1.00, "seeds"),
            "gla-alibi/lr0.001-s0": {"backbone": "gla", "pe": "alibi", "seed": 0, "stage": "grid", "status": "refused",
                                     "reason": "pe=alibi is a score scheme, which backbone=gla cannot use"},
            "gla-nope/lr0.001-s0": {"backbone": "gla", "pe": "nope", "seed": 0, "stage": "grid", "status": "failed",
                                    "reason": "RuntimeError: a fault"}}
    (tmp_path / "mqar.json").write_text(json.dumps({"task": "mqar", "title": "MQAR", "chosen_lr": {"gla-rope": 1e-2},
                                                    "runs": runs, "sessions": [{"date": "d", "device": "x",
                                                    "finished": 4, "pairs": 3, "refused": 1, "command": c,
                                                    "commit": "k", "software": sw}
                                                   for sw, c in (("s", "c"), ("t", "a|b <end>"), ("s", "c"))]}))
    rows = [x for x in results.table("mqar").splitlines() if x.startswith("| gla |")]
    # columns: the sweep's schemes (nope, rope, selective_rope, alibi, t5, vo_rope), a pair with no run "not run";
    # 90, 95, 100 -> 95.0 ± 5.0; halved at 512 -> 47.5 ± 2.5
    assert [r.strip(" |").split(" | ")[1:] for r in rows[:2]] == [
        ["failed (see record)", "95.0 ± 5.0", "not run", "refused: score scheme", "not run", "not run"],
        ["failed (see record)", "47.5 ± 2.5", "not run", "refused: score scheme", "not run", "not run"]]
    assert sum(x.startswith("| ") and " | " in x and x.split(" | ")[0][2:] in results.BACKBONES
               for x in results.table("mqar").splitlines()) == 3 * 12  # every backbone a row, in each table
    assert results.cell(json.loads((tmp_path / "mqar.json").read_text()), "mamba2", "rope", "at 128 (trained)") == \
        "not run"
    # the sessions in one line under the tables, each in a row of how_it_runs.md's table (| and < escaped)
    assert "Runs: 3 sessions (d) on x, 12 runs finished; each session's command, code and software: [how it runs]" \
        "(how_it_runs.md#mqar). Record:" in results.table("mqar")
    assert results.sessions_table("mqar").splitlines()[4:] == [
        "| d | x | 4 | 2, 1 | c | k | s |", "| d | x | 4 | 2, 1 | a\\|b &lt;end> | k | t |",
        "| d | x | 4 | 2, 1 | c | k | s |"]
    assert results.anchor("Retrieval (trained at 512)") == "retrieval-trained-at-512"


def test_the_readmes_s2_line_is_drawn_from_the_cells_with_three_seeds(tmp_path, monkeypatch):
    """results.s2_summary from a record written by hand: PaTH's cell (its runs' span within, its mean past), the
    other cells with three seeds at chance or above it with their scheme; a cell of one seed is not counted."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import results
    monkeypatch.setattr(results, "RECORDS", tmp_path)
    runs, chosen = {}, {}
    for pair, within, past in (("path-nope", (1.0, 1.0, 0.999), (0.99, 0.97, 1.0)),
                               ("transformer-selective_rope", (0.9, 0.95, 0.85), (0.5, 0.5, 0.5)),
                               ("gla-nope", (0.55, 0.5, 0.52), (0.5, 0.5, 0.5)), ("gla-rope", (0.9,), (0.9,))):
        backbone, pe = pair.split("-")
        chosen[pair] = 1e-3
        for seed, (w, p) in enumerate(zip(within, past)):
            runs[f"{pair}/{'lr0.001-s0' if seed == 0 else f'best-s{seed}'}"] = {
                "backbone": backbone, "pe": pe, "seed": seed, "stage": "seeds" if seed else "grid",
                "status": "finished", "lr": 1e-3, "scores": {"<= 128 (trained)": w, "129-512": p}}
    (tmp_path / "s2.json").write_text(json.dumps({"task": "s2", "title": "S2 parity", "chosen_lr": chosen,
                                                  "runs": runs, "sessions": []}))
    assert results.s2_summary() == (
        "**S2 parity** (3 of 39 pairs with three seeds so far): PaTH and PaTH-FoX reach 99.9–100.0% within the "
        "training length in every run and 98.7% past it (cell means); of the other 2 cells 1 stays at chance within "
        "it (under 60%) and 1 rises above it, 1 of them with Selective RoPE (best: transformer + selective_rope "
        "90.0%), none above 50.0% past it.")


def test_the_readmes_retrieval_line_is_drawn_from_the_cells(tmp_path, monkeypatch):
    """results.retrieval_summary from a record written by hand: the cells over 40% at 8k, best first; RoPE's best
    cell there; the decaying recurrences' best at the training length; the seeds count from the accepted pairs."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import results
    monkeypatch.setattr(results, "RECORDS", tmp_path)
    runs, chosen = {}, {}
    labels = [label for label, _ in results.TASKS["retrieval"]["points"]]
    for pair, seeds in (("fox-nope", [(0.7, 0.6, 0.5, 0.3)] * 3), ("deltanet-nope", [(0.7, 0.6, 0.41, 0.1)] * 3),
                        ("path-nope", [(0.7, 0.5, 0.4, 0.1)] * 3),  # 40.0% at 8k: not over 40%
                        ("transformer-rope", [(0.7, 0.01, 0.0, 0.0), (0.7, 0.0, 0.06, 0.0), (0.7, 0.0, 0.0, 0.0)]),
                        ("gla-nope", [(0.004, 0.0, 0.0, 0.0)] * 2)):
        backbone, pe = pair.split("-")
        chosen[pair] = 1e-3
        for seed, scores in enumerate(seeds):
            runs[f"{pair}/{'lr0.001-s0' if seed == 0 else f'best-s{seed}'}"] = {
                "backbone": backbone, "pe": pe, "seed": seed, "stage": "seeds" if seed else "grid",
                "status": "finished", "lr": 1e-3, "scores": dict(zip(labels, scores))}
    (tmp_path / "retrieval.json").write_text(json.dumps({"task": "retrieval", "title": "Retrieval",
                                                         "chosen_lr": chosen, "runs": runs, "sessions": []}))
    assert results.retrieval_summary() == (
        "**Retrieval** (4 of 24 pairs with three seeds so far, trained at 512): at 16× the length (8k) the cells "
        "over 40% are fox + nope 50.0%, deltanet + nope 41.0%; with RoPE every cell is at ≤ 2.0%; RetNet, Mamba2 "
        "and GLA learn nothing at this budget (≤ 0.4% at 512).")


def test_the_readmes_negeig_sentence_is_drawn_from_the_sweeps_table(tmp_path, monkeypatch):
    """results.negeig_summary: the span of s2_negeig's best runs within and past the training length, from
    collect_sweep's results.csv; nothing where the sweep has not run."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import results
    monkeypatch.setattr(results, "RECORDS", tmp_path)
    assert results.negeig_summary() == ""
    (tmp_path / "s2_negeig").mkdir()
    (tmp_path / "s2_negeig" / "results.csv").write_text(
        "model,task,val_acc,val_acc_extrap,lr\ndeltanet + nope,s2,1.0,0.97284375,0.0015\n"
        "gated_deltanet + rope,s2,0.9996,0.999,0.0005\n")
    assert results.negeig_summary() == (
        " With PaTH's range of β, (0, 2), DeltaNet and Gated DeltaNet reach 100.0% within the training length and "
        "97.3–99.9% past it (2 pairs: `sweep=s2_negeig`, seed 0, each pair at its best lr).")


def test_a_sweeps_table_breaks_a_tie_on_its_metric_as_the_results_page_does():
    """collect_sweep's best run of a cell: the highest metric, then the lower val_loss (common/grid.rank, the rule
    the page's lr choice follows), whatever order the runs are read in; S2's 100% within the training length ties
    often."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import collect_sweep

    def run(lr, acc, loss):
        return {"task": "s2", "val_acc": acc, "val_loss": loss, "lr": lr,
                "config": {"model": {"n_layer": 2}, "backbone": {"name": "gated_deltanet"}, "data": {"name": "s2"},
                           "pe": {"name": "nope"}, "seed": 0, "optim": {"lr": lr}}}
    runs = [run(1.7e-4, 1.0, 0.07), run(1.5e-3, 1.0, 0.007), run(5e-4, 0.99, 0.001)]
    for order in (runs, runs[::-1]):
        (best,) = collect_sweep.collect(order, "val_acc").values()
        assert best["lr"] == 1.5e-3
    (best,) = collect_sweep.collect([run(1e-3, None, 0.1), run(3e-3, 0.5, 0.9)], "val_acc").values()
    assert best["lr"] == 3e-3  # a run without the metric ranks last


def test_the_dual_pairs_table_adds_the_delta_rule_with_paths_beta_range_beside_its_pair(tmp_path, monkeypatch):
    """duality_table: below PaTH <-> DeltaNet and PaTH-FoX <-> Gated DeltaNet, the same pairs with DeltaNet's beta in
    (0, 2) (sweep=s2_negeig's best run, seed 0) on S2, "not run" on the other tasks; no such row without the sweep."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import results
    monkeypatch.setattr(results, "RECORDS", tmp_path)
    (tmp_path / "s2.json").write_text((ROOT / "docs" / "results" / "s2.json").read_text())
    (tmp_path / "mqar.json").write_text((ROOT / "docs" / "results" / "mqar.json").read_text())
    plain = results.duality_table()
    assert "β in (0, 2)" not in plain and len(plain.splitlines()) == 2 + len(results.DUAL_PAIRS)
    (tmp_path / "s2_negeig").mkdir()
    (tmp_path / "s2_negeig" / "results.csv").write_text(
        "model,task,val_acc,val_acc_extrap,lr\ndeltanet + nope,s2,1.0,0.97284375,0.0015\n"
        "deltanet + rope,s2,1.0,0.5,0.0005\n")  # a scheme no dual pair has: no row
    lines = results.duality_table().splitlines()
    assert len(lines) == 3 + len(results.DUAL_PAIRS)
    i = next(k for k, line in enumerate(lines) if line.startswith("| PaTH ↔ DeltaNet |"))
    path, neg = lines[i].split(" | "), lines[i + 1].split(" | ")
    assert neg[:3] == ["| PaTH ↔ DeltaNet, β in (0, 2)", "path + nope", "deltanet + nope, allow_neg_eigval"]
    assert neg[3:5] == ["not run", "not run"]  # MQAR's two points
    assert neg[5] == path[5].split(" vs ")[0] + " vs 100.0 (1 seed)"
    assert neg[6].rstrip(" |") == path[6].split(" vs ")[0] + " vs 97.3 (1 seed)"


def test_a_runs_cost_is_its_wall_time_over_the_mean_number_of_jobs_on_its_gpu(tmp_path, monkeypatch):
    """launcher.jsonl -> each run's GPU-seconds (the status table's time left): 4 jobs side by side for 800 s cost
    about 200 each (a refused job's 10 s beside them hardly counts); a job alone its whole wall time; a paused run
    the sum of its launches; another GPU's jobs, passed-over and not-started rows count for nothing; a sweep beside
    it on the same GPU counts."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import results
    monkeypatch.setattr(results, "RECORDS", tmp_path / "records")
    sweep = tmp_path / "s2"
    sweep.mkdir()

    def row(gpu, backbone, start, wall, status="COMPLETED", lr="0.0005", seed=0):
        over = [f"backbone={backbone}", "pe=nope", f"seed={seed}"] + ([f"optim.lr={lr}"] if lr else [])
        return json.dumps({"job": 0, "gpu": gpu, "overrides": over + ["sweep=results_s2"], "start": start,
                           "wall_s": wall, "status": status, "returncode": 0})
    rows = [row(0, b, 1000, 800) for b in ("transformer", "fox", "gla", "path")]
    rows += [row(0, "sympow", 1800, 100),                                             # alone after them
             row(0, "deltanet", 5000, 100, "PAUSED"), row(0, "deltanet", 6000, 300),  # paused, then resumed
             row(1, "mamba2", 1000, 800, lr=None, seed=1),                            # GPU 1, a seeds run
             row(0, "linear_attn", 1100, 10, "FAILED"),                               # refused beside the 4
             row(0, "retnet", 1000, 0.01, "DONE_BEFORE"), row(0, "retnet", 1000, 0, "NOT_STARTED"),
             row(0, "retnet", 1000, 0.02, "REFUSED"), row(0, "retnet", 1000, 0.02, "WAITING")]  # no place
    (sweep / "launcher.jsonl").write_text("\n".join(rows) + "\n")
    assert results.gpu_seconds(sweep) == pytest.approx({  # 800 s over 4 jobs, and a fifth for 10 of them: 199.4 s
        **{f"{b}-nope/lr0.0005-s0": 800 ** 2 / (4 * 800 + 10) for b in ("transformer", "fox", "gla", "path")},
        "linear_attn-nope/lr0.0005-s0": 10 / 5,
        "sympow-nope/lr0.0005-s0": 100, "deltanet-nope/lr0.0005-s0": 400, "mamba2-nope/best-s1": 800})
    # collected: a finished run keeps its cost, a run never finished has none
    _finished(sweep, "fox-nope", "lr0.0005-s0", 0.0005, 0.9)
    (sweep / "gla-nope" / "lr0.0005-s0").mkdir(parents=True)
    runs = results.collect_runs(sweep, "mqar")
    assert runs["fox-nope/lr0.0005-s0"]["gpu_s"] == 199.4 and "gpu_s" not in runs["gla-nope/lr0.0005-s0"]
    assert runs["fox-nope/lr0.0005-s0"]["wall_s"] == 800 and "wall_s" not in runs["gla-nope/lr0.0005-s0"]
    assert results.completed_walls(sweep)["deltanet-nope/lr0.0005-s0"] == 300  # the job that completed it
    # another task's sweep beside it (its folder next to this one) shares the GPU: its jobs count as neighbours
    # there, not as this sweep's runs; a row naming another host is another machine's GPU 0
    (tmp_path / "retrieval").mkdir()
    (tmp_path / "retrieval" / "launcher.jsonl").write_text(row(1, "gla", 1000, 800) + "\n" + json.dumps(
        {**json.loads(row(0, "gla", 1800, 100)), "host": "elsewhere"}) + "\n")
    cost = results.gpu_seconds(sweep)
    assert cost["mamba2-nope/best-s1"] == pytest.approx(400) and cost["sympow-nope/lr0.0005-s0"] == 100
    assert "gla-nope/lr0.0005-s0" in cost and len(cost) == 8  # the other sweep's jobs are no run of this one


def test_the_status_table_counts_the_runs_over_and_the_hours_left_from_the_records(tmp_path, monkeypatch):
    """progress(): the grid and seeds runs over among the pairs the model accepts (S2's sweep: 39 of 12 x 6, 3 lrs),
    no seeds owed by a pair diverged at every lr, and the time left at each backbone's mean cost (another task's,
    scaled by the tasks' ratio on shared backbones; else the slowest's). The page's table says it."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import results
    monkeypatch.setattr(results, "RECORDS", tmp_path)

    def run(pair, name, lr, status="finished", gpu_s=100.0):
        b, p = pair.split("-", 1)
        stage = "seeds" if name.startswith("best") else "grid"
        return {f"{pair}/{name}": {"backbone": b, "pe": p, "seed": int(name[-1]), "stage": stage, "status": status,
                                   "lr": lr, "val_loss": 1.0, "val_acc": 0.9, "gpu_s": gpu_s,
                                   "scores": {"<= 128 (trained)": 0.9, "129-512": 0.5}}}
    grid = results.planned_grid("s2")
    assert grid == [1.7e-4, 5e-4, 1.5e-3]
    runs = {k: v for lr in grid for k, v in run("transformer-nope", f"lr{lr}-s0", lr).items()}
    runs |= run("transformer-nope", "best-s1", 5e-4)
    runs |= run("fox-nope", "lr0.0005-s0", 5e-4, "diverged", 200.0)
    runs |= {k: v for lr in grid for k, v in run("fox-rope", f"lr{lr}-s0", lr, "diverged", 200.0).items()}
    session = {"date": "2026-11-30", "device": "x", "finished": 5, "pairs": 3, "refused": 0, "command": "c",
               "commit": "k", "software": "s"}
    (tmp_path / "s2.json").write_text(json.dumps({"task": "s2", "title": "S2 parity", "runs": runs,
                                                  "chosen_lr": {"transformer-nope": 5e-4}, "sessions": [session]}))
    p = results.progress("s2")
    assert {k: p[k] for k in ("pairs", "refused", "grid", "grid_of", "diverged", "seeds", "seeds_of", "whole")} == {
        "pairs": 39, "refused": 33, "grid": 7, "grid_of": 117, "diverged": 4, "seeds": 1, "seeds_of": 76, "whole": 0}
    # left: transformer 6 pairs x 5 runs - 4 = 26 at 100 s; FoX nope 2 grid + 2 seeds, rope none (diverged at every
    # lr), selective_rope 5: 9 at 200 s; the other 150 runs at the slowest's 200 s
    assert p["runs_left"] == 185 and p["hours_left"] == pytest.approx((26 * 100 + 9 * 200 + 150 * 200) / 3600)
    # a backbone with no S2 run yet costs its retrieval cost scaled by S2/retrieval on the backbones both have
    (tmp_path / "retrieval.json").write_text(json.dumps({"task": "retrieval", "title": "R", "chosen_lr": {},
                                                         "sessions": [session], "runs": {
        **run("transformer-nope", "lr0.001-s0", 1e-3, gpu_s=50.0), **run("gla-nope", "lr0.001-s0", 1e-3, gpu_s=30.0)}}))
    assert results.run_costs("s2") == pytest.approx({"transformer": 100.0, "fox": 200.0, "gla": 60.0})
    row = next(x for x in results.status_table().splitlines() if x.startswith("| [S2 parity]"))
    # GLA's 15 runs at 60 s, not 200: (26 * 100 + 9 * 200 + 15 * 60 + 135 * 200) / 3600 = 8.97 hours
    assert row.endswith("schemes: 39 accepted, 33 refused by the model | 7 of 117 (4 diverged) | 1 of 76 | 0 of 39 | "
                        "**under way**: 185 runs left, about 9.0 hours of one H200 (each backbone's mean cost a run so "
                        "far) |")
    assert "state (2026-11-30)" in results.status_table()
    # the last run left: one run, its time in minutes
    monkeypatch.setattr(results, "progress", lambda task: {**p, "runs_left": 1, "hours_left": 110 / 3600})
    row = next(x for x in results.status_table().splitlines() if x.startswith("| [S2 parity]"))
    assert "**under way**: 1 run left, about 2 minutes of one H200 (each backbone's" in row, row


def test_the_launchers_precheck_refuses_a_pair_as_its_process_would_and_a_bad_precheck_is_named(tmp_path):
    """hydra.launcher.precheck (duality.model.refusal): the model's refusal of a job's config, the same message
    train.py prints, read before any process starts; None for a pair the model builds or a config with no model.
    precheck=null leaves the refusal to the job's own process; a name that is no function is an error at once."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from duality.model import refusal
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        refused = compose("config", overrides=["backbone=gla", "pe=alibi"])
        built = compose("config", overrides=["backbone=gla", "pe=rope"])
    assert refusal(refused).startswith("pe=alibi is a score scheme, which backbone=gla cannot use (it accepts ")
    assert refusal(built) is None and refusal(OmegaConf.create({"optim": {"lr": 1}})) is None
    r = subprocess.run([sys.executable, "train.py", "task=mqar", "backbone=gla", "pe=alibi", *TINY[:-2]], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and f"error: {refusal(refused)}" in r.stderr  # what the job's own process says

    sweep = tmp_path / "sweep"
    r = _sweep(sweep, "sweep=results_mqar", "backbone=gla", "pe=alibi", "optim.lr=1e-3", "hydra.launcher.precheck=null")
    log = (sweep / "gla-alibi" / "lr0.001-s0" / "job.log").read_text()
    assert r.returncode == 1 and "[launcher] job" in log and f"error: {refusal(refused)}" in log
    r = _sweep(tmp_path / "bad", "sweep=results_mqar", "backbone=gla", "pe=rope", "hydra.launcher.precheck=no.such")
    assert r.returncode == 1 and "hydra.launcher.precheck=no.such: no such function" in r.stderr
    r = _sweep(tmp_path / "bad", "sweep=results_mqar", "backbone=gla", "pe=rope", "hydra.launcher.ready=no.such")
    assert r.returncode == 1 and "hydra.launcher.ready=no.such: no such function" in r.stderr


@pytest.mark.slow
def test_the_allocation_script_runs_grid_and_seeds_side_by_side_and_the_next_allocation_goes_on(tmp_path):
    """scripts/results_sweeps.sh SECONDS mqar, twice (two allocations): the first trains the grid, and the seeds
    launch beside it trains a pair's seeds if its grid finished in time, else they wait for it and go once more when
    the grid's launch has ended, all at the grid's best lr (exit 0); the second passes over what is done. A task that
    is none is refused before any launch."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "SWEEPS_DIR": str(tmp_path),
           "OUT": str(tmp_path / "elsewhere"),  # a job environment's own OUT (a lease's) is not where the sweeps go
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")])),
           "EXTRA": " ".join([*TINY, NO_RECORD, "backbone=transformer", "pe=rope"])}
    plain = env["EXTRA"]
    env["EXTRA"] += " hydra.launcher.ready=ready_once.seeds_wait_in_the_first_launch"

    def allocation(*tasks):
        return subprocess.run(["bash", "scripts/results_sweeps.sh", "600", *tasks], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
    r = allocation("mqar", "copying")
    assert r.returncode == 2 and "no task copying: choose from mqar retrieval s2 or a sweep of conf/sweep/" in r.stderr
    assert not any(tmp_path.iterdir())
    r = allocation("mqar")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # the seeds launch beside the grid holds its jobs (tests/ready_once.py), and goes again once the grid's has ended
    assert "[hydra] 3 jobs: 3 completed" in r.stdout and "[hydra] 2 jobs: 2 waiting" in r.stdout, r.stdout
    assert "again, for their waiting jobs: results_mqar_seeds\n" in r.stdout, r.stdout
    assert "[hydra] 2 jobs: 2 completed" in r.stdout, r.stdout
    r = allocation("mqar")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "[hydra] 3 jobs: 3 done before" in r.stdout and "[hydra] 2 jobs: 2 done before" in r.stdout
    assert "again" not in r.stdout
    grid = {lr: json.loads((tmp_path / "mqar" / "transformer-rope" / f"lr{lr}-s0" / "task_eval.json").read_text())
            for lr in (0.001, 0.003, 0.01)}
    best = max(grid, key=lambda lr: (grid[lr]["val_acc"], -grid[lr]["val_loss"]))
    for seed in (1, 2):
        run = json.loads((tmp_path / "mqar" / "transformer-rope" / f"best-s{seed}" / "task_eval.json").read_text())
        assert run["config"]["optim"]["lr"] == best and run["config"]["seed"] == seed
    assert (tmp_path / "mqar-grid.log").is_file() and (tmp_path / "mqar-seeds.log").is_file()
    # each launch said it had dealt every job: the grid's before the seeds launch started (the script waits on it)
    assert (tmp_path / "mqar-grid.log").read_text().count("every job dealt") == 1
    assert not (tmp_path / "elsewhere").exists()
    # another sweep config (not a results task): one launch, into a folder of its name, under the allocation's rules
    r = subprocess.run(["bash", "scripts/results_sweeps.sh", "600", "parity"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env={**env, "EXTRA": plain + " seed=0,1 model.n_heads=2"})
    assert r.returncode == 0 and "[hydra] 2 jobs: 2 completed" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    rows = _rows(tmp_path / "parity")
    assert len(rows) == 2 and all(x["per_gpu"] == 2 for x in rows)  # the script's hydra/launcher=gpus, at EXTRA's 2
