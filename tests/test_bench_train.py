"""benchmarks/bench_train.py: every case it names is a valid configuration, and its reference is the GPT-2 it claims."""

import json
import sys

import bench_train
import pytest
import torch


@pytest.mark.parametrize("case", list(bench_train.CASES))
def test_every_case_builds_and_trains_one_step(case):
    model, optim_cfg, _ = bench_train.build(case, "tiny", 32, 128)
    x = torch.randint(0, 128, (2, 33))
    _, loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    assert torch.isfinite(loss) and model.flops_per_token(32) > 6 * 0.9 * model.num_params(True)


@pytest.mark.slow
def test_reference_is_gpt2_small():
    ref, _, _ = bench_train.build("ref", "124m", 1024, 50304)
    n = sum(p.numel() for p in ref.parameters())
    # GPT-2 small, bias-free, tied head, 50,304-token vocabulary: nanoGPT prints 123.59M (without the position table)
    assert n - 1024 * 768 == 123_587_328
    gpt, _, _ = bench_train.build("transformer+rope", "124m", 1024, 50304)
    # the same FLOP convention: 6 x matmul parameters + 3 x the causal attention's forward FLOPs
    matmul = sum(p.numel() for n, p in ref.named_parameters() if n.startswith("blocks")) + 50304 * 768
    attention = 3 * sum(b.mixer.flops_per_token(1024) for b in gpt.blocks)
    assert ref.flops_per_token(1024) == 6 * matmul + attention


def test_overrides_reach_every_case():
    model, _, _ = bench_train.build("fox+nope", "tiny", 32, 128, ["model.fused_loss=true", "backbone.short_conv=true"])
    assert model.cfg.fused_loss and model.blocks[0].mixer.conv is not None
    with pytest.raises(Exception, match="no_such_key"):
        bench_train.build("transformer+rope", "tiny", 32, 128, ["model.no_such_key=1"])


def test_outputs_of_a_run_whose_cases_all_failed(tmp_path):
    rows = [{"case": "transformer+rope", "size": "124m", "seq_len": 1024, "compile": True,
             "error": "OutOfMemoryError: CUDA out of memory"}]
    assert "OutOfMemoryError" in bench_train.table(rows)
    bench_train.plot(rows, tmp_path / "b.png")  # nothing to draw: no figure, no error
    assert not (tmp_path / "b.png").exists()


def _row(case, ms, size="124m", seq=1024):
    return {"case": case, "size": size, "seq_len": seq, "batch": 32, "compile": True, "ms": ms,
            "tokens_per_s": 32 * seq / ms * 1e3, "mfu": None, "peak_mem_gib": 1.0, "first_step_s": 1.0, "loss": 1.0}


def test_resume_measures_only_what_the_cut_run_lacks(tmp_path, monkeypatch):
    # the cut run finished ref; its partial file keeps that row, and the resumed run measures only the rest
    (tmp_path / "bench_train_x.partial.json").write_text(json.dumps([_row("ref", 60.0)]))
    measured = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "test GPU")
    monkeypatch.setattr(bench_train, "measure", lambda case, *a, **k: measured.append(case) or _row(case, 80.0))
    monkeypatch.setattr(sys, "argv", ["bench_train.py", "--settings", "124m:1024", "--cases", "ref",
                                      "transformer+rope", "--compile", "on", "--out", str(tmp_path), "--tag", "_x",
                                      "--resume"])
    bench_train.main()
    assert measured == ["transformer+rope"]
    rows = json.loads((tmp_path / "bench_train_x.json").read_text())["rows"]
    assert [r["case"] for r in rows] == ["ref", "transformer+rope"]
    assert rows[1]["x_ref"] == pytest.approx(60.0 / 80.0)  # ratios span the kept and the new rows
    assert not (tmp_path / "bench_train_x.partial.json").exists()


def test_merge_appends_a_run_to_a_history(tmp_path):
    meta = {"date": "2026-11-23", "device": "test GPU", "torch": "2.11"}
    for name, rows in (("a.json", [_row("transformer+rope", 70.0), _row("gla+nope", 100.0)]),
                       ("b.json", [_row("gla+nope", 90.0)])):
        (tmp_path / name).write_text(json.dumps({**meta, "command": f"bench {name}", "rows": rows}))
    hist = tmp_path / "hist.json"
    bench_train.merge(hist, tmp_path / "a.json", "A", "first")
    bench_train.merge(hist, tmp_path / "b.json", "B", "")
    md = (tmp_path / "hist.md").read_text()
    assert "- run A: `bench a.json` — 2026-11-23, first" in md and "- run B: `bench b.json` — 2026-11-23" in md
    assert [line.split(" | ")[0] for line in md.splitlines() if line.startswith("| A") or line.startswith("| B")] == \
        ["| A", "| A", "| B"]
    assert (tmp_path / "hist.png").exists()
    # the summary table: each case's latest row (run B's gla replaces run A's), one column per setting x mode
    assert bench_train.summary([hist]).splitlines()[2:] == ["| transformer+rope | 70.0 |", "| gla+nope | 90.0 |"]
    with pytest.raises(SystemExit, match="already has a run 'B'"):
        bench_train.merge(hist, tmp_path / "b.json", "B", "")


@pytest.mark.parametrize("case", list(bench_train.FLA_CASES))
@pytest.mark.slow
def test_fla_peers_have_this_repos_shape(case):
    """FLA's own model of each kind, built at the 370m shape (not run: its kernels need a GPU): the same width,
    depth, heads, MLP and vocabulary, and the same parameter count as this repo's model of that kind, to the
    parameter, so the --vs-fla table compares models of one shape (PaTH: its w projection of rank 32, `w_rank`, as
    FLA's; with a full one it had 23.6M more)."""
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        peer, _, _ = bench_train.build(case, "370m", 4096, 32000)
        ours, _, _ = bench_train.build(bench_train.FLA_CASES[case][2], "370m", 4096, 32000)
    cfg = peer.m.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_heads, cfg.intermediate_size, cfg.vocab_size) == \
        (1024, 24, 16, 2816, 32000)
    n_peer, n_ours = sum(p.numel() for p in peer.parameters()), ours.num_params()
    assert n_peer == n_ours, (n_peer, n_ours)


def test_activation_checkpointing_reaches_the_cases():
    model, _, _ = bench_train.build("gla+nope", "tiny", 32, 128, ["train.activation_checkpointing=full"])
    assert {b.checkpointing for b in model.blocks} == {"full"}


def test_compile_mode_and_scope_reach_this_repos_cases_only(monkeypatch):
    """--set train.compile_mode / train.compile_scope: how build's compile function compiles this repo's models
    (block by block unless scope model is set); the reference is compiled whole in the default mode."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None, **kw: calls.append(mode) or fn)
    mode = "max-autotune-no-cudagraphs"
    model, _, compile_ = bench_train.build("gla+nope", "tiny", 32, 128, [f"train.compile_mode={mode}"])
    assert compile_(model) is model and calls == [mode] * (len(model.blocks) + 1)
    calls.clear()
    ref, _, compile_ = bench_train.build("ref", "tiny", 32, 128)
    compile_(ref)
    model, _, compile_ = bench_train.build("gla+nope", "tiny", 32, 128, ["train.compile_scope=model"])
    compile_(model)
    assert calls == [None, None] and model.compiled_head is None


def test_vs_fla_table_from_runs_and_call_records(tmp_path):
    """--vs-fla: each case's latest valid row across files (a run's {"rows"} and docs/memory's {"calls"}; ours from
    the FLA row's own call where it has one), the ratios FLA ms / ours compiled ms and ours GiB / FLA GiB, the goals,
    failures named, and where each row came from."""
    def row(case, compile, ms, gib, **kw):
        return {"case": case, "size": "370m", "seq_len": 4096, "compile": compile, "ms": ms, "peak_mem_gib": gib, **kw}
    peers = tmp_path / "peers.json"
    peers.write_text(json.dumps({"rows": [row("fla:gla", False, 260.0, 40.0), row("fla:retnet", False, 200.0, 40.0),
                                          row("fla:delta_net", False, 100.0, 10.0)]}))
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps({"calls": [
        {"call": "r1", "rows": [row("gla+nope", True, 999.0, 99.0), row("retnet+nope", True, 150.0, 44.0),
                                {"case": "gla+nope", "size": "370m", "seq_len": 4096, "compile": False,
                                 "error": "OutOfMemoryError: CUDA out of memory"}]},
        {"call": "r2", "rows": [row("gla+nope", True, 200.0, 38.0), row("retnet+nope", True, 1.0, 1.0, valid=False),
                                row("fla:gla", False, 250.0, 40.0)]},
        # later, but another call than FLA's GLA row: r2's row, beside the peer, is the one compared
        {"call": "r3", "rows": [row("gla+nope", True, 210.0, 38.0), row("retnet+nope", True, 160.0, 44.0)]}]}))
    lines = bench_train.vs_fla([peers, ours]).splitlines()
    cells = {r.split(" ")[1]: [c.strip() for c in r.strip("|").split("|")[1:]] for r in lines[2:]}
    assert cells["gla+nope"] == ["200.0 / 38.0", "out of memory", "250.0 / 40.0", "1.25x / 0.95x", "no / yes",
                                     "ours.json r2; ours.json r1"]
    # no row beside FLA's RetNet: the latest (r3); the invalid r2 row is left out
    assert cells["retnet+nope"] == ["160.0 / 44.0", "not measured", "200.0 / 40.0", "1.25x / 1.10x", "no / no",
                                    "ours.json r3; peers.json"]
    assert set(cells) == {"gla+nope", "retnet+nope"}  # a peer without this repo's row: no comparison


def test_kernel_breakdown_sorts_kernels_by_kind_and_shows_the_idle_time():
    kernels = [("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT", 30_000.0),  # cuBLAS on Hopper
               ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 6_000.0),
               ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", 9_000.0),
               ("chunk_gla_fwd_kernel_o", 3_000.0),
               ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 300.0),
               ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", 1_500.0),
               ("Memcpy DtoD (Device -> Device)", 150.0)]
    assert [bench_train.kernel_kind(n) for n, _ in kernels] == [
        "matmul", "matmul", "torch.compile (Inductor)", "hand-written Triton (FLA / kernels/)", "copies / fills",
        "optimizer", "copies / fills"]
    text = bench_train.kernel_breakdown(kernels, steps=3, step_ms=20.0).splitlines()
    rows = {line[:42].strip(): float(line[42:].split()[0]) for line in text[1:]}
    assert rows["matmul"] == 12.0 and rows["torch.compile (Inductor)"] == 3.0 and rows["optimizer"] == 0.5
    assert rows["GPU idle (step time - kernel time)"] == pytest.approx(20.0 - 49_950 / 3 / 1e3, abs=0.05)
    assert text[1].startswith("matmul")  # largest first
    # the profiled steps' own time is what the idle is taken against; kernels summing above it are flagged
    text = bench_train.kernel_breakdown(kernels, steps=3, step_ms=20.0, profiled_ms=18.0).splitlines()
    assert float(text[-1][42:].split()[0]) == pytest.approx(18.0 - 49_950 / 3 / 1e3, abs=0.05)
    flagged = bench_train.kernel_breakdown(kernels, steps=3, step_ms=20.0, profiled_ms=15.0).splitlines()
    assert flagged[-1].startswith("(the kernels sum to 16.6 ms, more than the 15.0 ms step")
    # a profiler that slowed the steps: the idle against the unprofiled step is given too
    slowed = bench_train.kernel_breakdown(kernels, steps=3, step_ms=20.0, profiled_ms=70.0).splitlines()
    assert float(slowed[-2][42:].split()[0]) == pytest.approx(70.0 - 49_950 / 3 / 1e3, abs=0.05)
    assert slowed[-1] == ("(the profiler slowed the steps from 20.0 to 70.0 ms, the host's launches lagging, so most "
                          "of that idle time is the profiler's; against the unprofiled step the kernels leave 3.4 ms)")
    assert "slowed" not in "\n".join(text)
