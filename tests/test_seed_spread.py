"""scripts/seed_spread.py: the spread over seeds and the seed-by-seed gaps that the MQAR verdict (docs/synthetic)
rests on."""

import json

import pytest
import seed_spread


def records(tmp_path, runs: dict, name="runs.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"runs": {k: {"evaluations": [{"step": i, "val_acc": a} for i, a in enumerate(v)]}
                                         for k, v in runs.items()}}))
    return path


def test_scores_are_each_runs_best_evaluation_and_later_files_win(tmp_path):
    a = records(tmp_path, {"mqar256x16-d64-gla-nope-s0-lr1e-2": [0.1, 0.5, 0.4],
                           "mqar256x16-d64-gla-selective_rope-s1-lr4.6e-3": [0.2],
                           "s2-gla_st-nope-s3": [0.3]}, "a.json")
    b = records(tmp_path, {"mqar256x16-d64-gla-nope-s0-lr1e-2": [0.7]}, "b.json")
    scores = seed_spread.load([a, b])
    assert scores == {("mqar256x16", "d64-gla-nope", "1e-2"): {0: 0.7},
                      ("mqar256x16", "d64-gla-selective_rope", "4.6e-3"): {1: 0.2},
                      ("s2", "gla_st-nope", "task"): {3: 0.3}}
    assert seed_spread.load([a])[("mqar256x16", "d64-gla-nope", "1e-2")] == {0: 0.5}
    bad = records(tmp_path, {"no_seed_here": [0.1]}, "bad.json")
    with pytest.raises(SystemExit, match="no_seed_here"):
        seed_spread.load([bad])


def test_max_step_scores_runs_of_different_lengths_at_one_budget(tmp_path):
    # evaluations at steps 0, 1, 2, 3: the long run's best comes after step 1, the short run's within it
    a = records(tmp_path, {"s2-gla_st-selective_rope_st-s0": [0.5, 0.6, 0.9, 1.0],
                           "s2-gla_st_tau64-selective_rope_st-s0": [0.5, 0.7]})
    assert seed_spread.load([a], max_step=1) == {("s2", "gla_st-selective_rope_st", "task"): {0: 0.6},
                                                 ("s2", "gla_st_tau64-selective_rope_st", "task"): {0: 0.7}}
    assert seed_spread.load([a])[("s2", "gla_st-selective_rope_st", "task")] == {0: 1.0}
    # a run with no evaluation by then has no score
    assert ("s2", "gla_st-selective_rope_st", "task") not in seed_spread.load([a], max_step=-1)


def test_best_over_learning_rates_only_for_seeds_that_ran_them_all():
    scores = {("m", "x-nope", "1e-3"): {0: 0.2, 1: 0.6, 2: 0.9},
              ("m", "x-nope", "1e-2"): {0: 0.5, 1: 0.4}}
    best = seed_spread.with_best_lr(scores, ["1e-3", "1e-2"])[("m", "x-nope", "best lr")]
    assert best == {0: 0.5, 1: 0.6}  # seed 2 ran one of the two
    # a setting is scored over the grid's learning rates it was run at: here m2 over 1e-3 only
    scores[("m2", "x-nope", "1e-3")] = {0: 0.3}
    scores[("m2", "x-sel", "1e-3")] = {0: 0.1}
    scores[("m", "x-sel", "1e-2")] = {0: 0.9}  # m: every model over both, though x-sel ran only 1e-2
    best = seed_spread.with_best_lr(scores, ["1e-3", "1e-2"])
    assert best[("m2", "x-nope", "best lr")] == {0: 0.3} and best[("m2", "x-sel", "best lr")] == {0: 0.1}
    assert ("m", "x-sel", "best lr") not in best
    assert seed_spread.with_best_lr(scores, ["3e-3"]) == scores  # no setting ran the grid: nothing added, no error


def test_paired_differences_and_the_table(tmp_path):
    scores = {("m", "x-nope", "1e-3"): {0: 0.40, 1: 0.50, 2: 0.60},
              ("m", "x-sel", "1e-3"): {0: 0.50, 1: 0.70, 2: 0.55, 3: 0.99}}
    p = seed_spread.paired(scores[("m", "x-sel", "1e-3")], scores[("m", "x-nope", "1e-3")])
    # seeds 0-2 only: differences 0.10, 0.20, -0.05
    assert p["n"] == 3 and p["favour"] == 2 and p["mean"] == pytest.approx(0.25 / 3)
    assert p["se"] == pytest.approx(0.12583 / 3 ** 0.5, rel=1e-4)
    text = seed_spread.report(scores, baseline="nope")
    assert "| x-nope | 1e-3 | 3 | 50.0 ± 10.0 | s0 40.0, s1 50.0, s2 60.0 |" in text
    assert "| x-sel | 1e-3 | +8.3 ± 7.3 | 2 of 3 |" in text
    seed_spread.plot(seed_spread.with_best_lr(scores, ["1e-3"]), tmp_path / "seeds.png")
    assert (tmp_path / "seeds.png").stat().st_size > 0


def test_reads_synthetic_gpu_run_folders(tmp_path):
    for name, accs in {"mqar64x4-d64-gla-rope-s0-lr1e-3": [0.2, 0.3], "mqar64x4-d64-gla-rope-s1-lr1e-3": [0.6]}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text(
            "\n".join(json.dumps({"step": i, "val_acc": a}) for i, a in enumerate(accs)) + '\n{"step": 9, "loss": 1}\n')
    (tmp_path / "results.md").write_text("not a run")
    assert seed_spread.load([tmp_path]) == {("mqar64x4", "d64-gla-rope", "1e-3"): {0: 0.3, 1: 0.6}}


def test_differences_pool_the_pairs_of_every_setting():
    scores = {("a", "x-nope", "1e-3"): {0: 0.40, 1: 0.50}, ("a", "x-sel", "1e-3"): {0: 0.50, 1: 0.70},
              ("b", "x-nope", "1e-3"): {0: 0.60, 1: 0.60}, ("b", "x-sel", "1e-3"): {0: 0.55, 1: 0.90}}
    text = seed_spread.report(scores, baseline="nope")
    # pairs (a,0) +0.10, (a,1) +0.20, (b,0) -0.05, (b,1) +0.30: mean 0.1375, sd 0.1493
    assert "a + b, difference from *nope*, (setting, seed) pairs pooled (points):" in text
    assert "| x-sel | 1e-3 | +13.8 ± 7.5 | 3 of 4 |" in text
    assert "pooled" not in seed_spread.report({k: v for k, v in scores.items() if k[0] == "a"}, baseline="nope")


def test_record_of_run_folders_reads_back_as_the_folders_do(tmp_path):
    runs = tmp_path / "runs"
    names = {"mqar128x8-d64-gla-nope-s0-lr2.2e-2": True, "mqar128x8-d64-gla-rope-s0-lr2.2e-2": False}
    for name, finished in names.items():
        (runs / name).mkdir(parents=True)
        (runs / name / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
            {"step": 100, "loss": 3.0, "peak_mem_gib": 0.5}, {"step": 100, "val_loss": 2.0, "val_acc": 0.4},
            {"step": 200, "loss": 1.0, "peak_mem_gib": 0.7}, {"step": 200, "val_loss": 1.0, "val_acc": 0.6}]) + "\n")
        if finished:
            (runs / name / "task_eval.json").write_text(json.dumps({"curve": {"64": 1.0, "128": 0.0},
                                                                    "curve_char": {"64": 1.0, "128": 0.4},
                                                                    "config": {"not": "kept"}}))
    (runs / "mqar128x8-d64-gla-nope-s0-lr2.2e-2.log").write_text("a log, not a run")
    rec = seed_spread.record([runs], "two runs", "H100", "torch 2.11")
    assert rec["note"] == "two runs" and rec["device"] == "H100" and len(rec["runs"]) == 2
    nope = rec["runs"]["mqar128x8-d64-gla-nope-s0-lr2.2e-2"]
    assert nope["finished"] and not rec["runs"]["mqar128x8-d64-gla-rope-s0-lr2.2e-2"]["finished"]
    assert nope["curve_char"] == {"64": 1.0, "128": 0.4} and "config" not in nope
    assert "curve" not in rec["runs"]["mqar128x8-d64-gla-rope-s0-lr2.2e-2"]
    assert nope["train_peak_mem_gib"] == 0.7 and [e["step"] for e in nope["evaluations"]] == [100, 200]
    assert nope["tokens_per_step"] is None  # these rows log no tokens; train.py's do (the curves' x axis)
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(rec))
    assert seed_spread.load([path]) == seed_spread.load([runs])
    with pytest.raises(SystemExit, match="no run folder"):
        seed_spread.record([tmp_path / "runs" / "mqar128x8-d64-gla-nope-s0-lr2.2e-2"], "", "", "")


def test_curves_draw_each_seeds_training_and_its_best_evaluations_lengths(tmp_path):
    evals = [{"step": 500 * i, "val_acc": a, "val_acc_extrap": a / 2, "val_acc@64": a, "val_acc@512": a / 3}
             for i, a in enumerate([0.5, 0.9, 0.7], 1)]
    path = tmp_path / "s2.json"
    path.write_text(json.dumps({"runs": {"s2-gla_st-selective_rope_st-s0": {"evaluations": evals},
                                         "s2-gla_st-selective_rope_st-s1": {"evaluations": evals[:1]},
                                         "mqar64x4-d64-gla-nope-s0-lr1e-3": {"evaluations": [{"step": 1,
                                                                                               "val_acc": 0.2}]}}}))
    seed_spread.curves([path], tmp_path / "curves.png", "val_acc_extrap", setting="s2")
    assert (tmp_path / "curves.png").stat().st_size > 0
    # a run folder as train.py leaves it: the record keeps its tokens a step, the curves then plot tokens seen
    run = tmp_path / "runs" / "s2-gla_st-nope-s0"
    run.mkdir(parents=True)
    run.joinpath("metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"step": 100, "loss": 0.7, "tokens": 13209600}, *evals]) + "\n")
    assert seed_spread.record([run.parent], "", "", "")["runs"]["s2-gla_st-nope-s0"]["tokens_per_step"] == 132096
    seed_spread.curves([run.parent], tmp_path / "tokens.png", "val_acc")
    assert (tmp_path / "tokens.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="no run with evaluations"):
        seed_spread.curves([path], tmp_path / "none.png", "val_acc", setting="copy")
    # --max-step before a run's first evaluation leaves it out of the figure; before every run's, no figure
    seed_spread.curves([path], tmp_path / "early.png", "val_acc", max_step=1)  # only the MQAR run (step 1)
    assert (tmp_path / "early.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="no run with evaluations"):
        seed_spread.curves([path], tmp_path / "none.png", "val_acc", max_step=0)


def test_final_curves_are_the_finished_runs_curves_averaged_over_seeds(tmp_path):
    def run(strings, letters):
        return {"finished": True, "curve": {"64": 1.0, "96": strings}, "curve_char": {"64": 1.0, "96": letters},
                "evaluations": [{"step": 1, "val_acc": 0.5}]}
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"runs": {"copy-gla-nope-s0": run(0.1, 0.9), "copy-gla-nope-s1": run(0.3, 0.7),
                                      "copy-gla-sel-s0": run(0.0, 0.5),
                                      "copy-gla-sel-s1": {"evaluations": []},  # not finished: no final curves
                                      "s2-gla_st-nope-s0": run(1.0, 1.0)}}))
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"runs": {"copy-gla-sel-s0": run(0.2, 0.6)}}))  # a later file's run wins
    by_key = seed_spread.finals([a, b], setting="copy")
    assert by_key == {("copy", "gla-nope", "task"): {"curve": {0: {64: 1.0, 96: 0.1}, 1: {64: 1.0, 96: 0.3}},
                                                     "curve_char": {0: {64: 1.0, 96: 0.9}, 1: {64: 1.0, 96: 0.7}}},
                      ("copy", "gla-sel", "task"): {"curve": {0: {64: 1.0, 96: 0.2}},
                                                    "curve_char": {0: {64: 1.0, 96: 0.6}}}}
    table = seed_spread.final_table(by_key)
    assert "| copy | gla-nope | task | 0,1 | 100.0 ± 0.0 | 20.0 ± 14.1 |" in table
    assert "| copy | gla-sel | task | 0 | 100.0 | 60.0 |" in table
    seed_spread.plot_finals(by_key, tmp_path / "final.png")
    assert (tmp_path / "final.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="no finished run"):
        seed_spread.finals([a], setting="mqar")


def test_a_missing_record_is_named_before_any_is_read(tmp_path, monkeypatch):
    """A path that is not there: one line naming it (it was a FileNotFoundError traceback), nothing written."""
    good = records(tmp_path, {"mqar-a-s0": [0.5]})
    out = tmp_path / "rec.json"
    monkeypatch.setattr("sys.argv", ["seed_spread.py", str(good), str(tmp_path / "gone"), "--record", str(out)])
    with pytest.raises(SystemExit, match=f"no such record or run folder: {tmp_path / 'gone'}$"):
        seed_spread.main()
    assert not out.exists()
