"""scripts/float8_parity.py: the corpus, its packing as LongCrawl64-style arrays, and the paired comparison."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from float8_parity import compare, main

from duality import data as data_lib
from duality.data import longcrawl64
from duality.data.shards import read_shard


def test_corpus_packs_into_arrays_that_data_longcrawl64_reads(tmp_path):
    main(["corpus", str(tmp_path / "corpus.jsonl"), "--mb", "0.2"])
    rows = [json.loads(line) for line in (tmp_path / "corpus.jsonl").read_text().splitlines()]
    assert len(rows) >= 2 and all(len(r["text"]) >= 200 for r in rows)
    cfg = {"name": "text", "files": str(tmp_path / "corpus.jsonl"), "tokenizer": "bpe",  # format: auto, as the yaml
           "vocab_size": 300, "val_every": 2, "cache_dir": str(tmp_path / "cache")}
    info = data_lib.prepare(cfg, progress=False)
    main(["pack", info.dir, str(tmp_path / "packed"), "--doc-len", "64"])
    bos = int((tmp_path / "packed" / "bos.txt").read_text())
    lc = longcrawl64.open_arrays({"root": str(tmp_path / "packed"), "doc_len": 64, "bos_id": bos,
                                  "tokenizer": str(tmp_path / "packed" / "tokenizer.json")})
    assert lc.tokenizer.vocab_size == info.tokenizer.vocab_size and bos == info.tokenizer.eot_id
    for split, shards in (("train", info.train_shards), ("val", info.val_shards)):
        tokens = np.concatenate([read_shard(s) for s in shards])
        arr = np.asarray(lc.arrays[split])
        assert arr.shape == (len(tokens) // 64, 64)
        assert np.array_equal(arr.reshape(-1), tokens[:arr.size])


def _runs(tmp_path, curves):
    for name, losses in curves.items():
        (tmp_path / name).mkdir()
        rows = [{"step": 100 * (i + 1), "val_loss": v} for i, v in enumerate(losses)]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_paired_differences_against_bf16s_seed_gap(tmp_path):
    _runs(tmp_path, {"bf16-s0": [5.0, 4.0, 3.00, 2.00], "bf16-s1": [5.2, 4.1, 3.02, 2.01],
                     "tensorwise-s0": [5.1, 4.0, 3.05, 2.03], "tensorwise-s1": [5.0, 4.2, 3.06, 2.04]})
    main(["report", str(tmp_path), "--record", str(tmp_path / "r.json")])
    r = json.loads((tmp_path / "r.json").read_text())
    v = r["verdict"]["tensorwise"]
    assert r["seeds"] == ["0", "1"] and r["steps"] == [100, 200, 300, 400]
    assert r["rows"][0]["tensorwise"]["paired_diff"] == pytest.approx([0.1, -0.2])
    assert v["mean_bf16_spread_late"] == pytest.approx(0.015)   # steps 300, 400: gaps 0.02, 0.01
    assert v["mean_paired_diff_late"] == pytest.approx(0.0375)  # ((0.05 + 0.04) / 2 + (0.03 + 0.03) / 2) / 2
    assert v["positive_late"] == "4 of 4" and v["within_spread"] is False
    assert v["per_seed_late"] == pytest.approx([0.04, 0.035]) and v["se_late"] == pytest.approx(0.0025)
    assert v["worse_final"] == "2 of 2"
    close = compare({"bf16-s0": {1: 3.0, 2: 2.0}, "bf16-s1": {1: 3.1, 2: 2.1},
                     "tensorwise-s0": {1: 3.05, 2: 2.0}, "tensorwise-s1": {1: 3.1, 2: 2.08}})
    assert close["verdict"]["tensorwise"]["within_spread"] is True


def test_report_needs_two_bf16_seeds(tmp_path):
    _runs(tmp_path, {"bf16-s0": [3.0], "tensorwise-s0": [3.1], "tensorwise-s1": [3.2]})
    with pytest.raises(SystemExit, match="bf16-s<seed> for at least two seeds"):
        main(["report", str(tmp_path)])


def test_more_seeds_any_setting_and_its_plot(tmp_path):
    # three seeds of a setting the plot has no colour for in advance (quack's SwiGLU): a colour a recipe, a style a seed
    _runs(tmp_path, {"bf16-s0": [4.0, 3.00], "bf16-s1": [4.1, 3.10], "bf16-s2": [4.2, 3.05],
                     "quack-s0": [4.0, 3.02], "quack-s1": [4.1, 3.09], "quack-s2": [4.3, 3.08]})
    main(["report", str(tmp_path), "--record", str(tmp_path / "r.json"), "--plot", str(tmp_path / "p.png")])
    r = json.loads((tmp_path / "r.json").read_text())
    v = r["verdict"]["quack"]
    assert r["seeds"] == ["0", "1", "2"] and r["rows"][-1]["bf16_spread"] == pytest.approx(0.10)
    assert v["per_seed_late"] == pytest.approx([0.02, -0.01, 0.03]) and v["worse_final"] == "2 of 3"
    assert v["within_spread"] is True and (tmp_path / "p.png").stat().st_size > 10_000


def test_sh_deals_every_gpu_defaults_and_variants(tmp_path):
    """float8_parity.sh with stand-ins for nvidia-smi (2 GPUs) and python3 (records each launch): SEEDS runs each
    seed's pair, the variant's overrides only on its runs, and every GPU runs both kinds."""
    root = Path(__file__).resolve().parents[1]
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "nvidia-smi").write_text('#!/bin/sh\necho "GPU 0: X"; echo "GPU 1: X"\n')
    (bin_ / "python3").write_text(f'#!/bin/sh\necho "$CUDA_VISIBLE_DEVICES $*" >> {tmp_path}/calls\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    (tmp_path / "bos.txt").write_text("1")
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SEEDS": "2 3", "NAME": "quack",
           "VARIANT": "model.mlp_impl=quack", "MODEL": "370m", "RUNS": str(tmp_path / "runs")}
    subprocess.run(["bash", str(root / "scripts/float8_parity.sh"), str(tmp_path / "out"), str(tmp_path)], env=env,
                   cwd=root, check=True, capture_output=True)
    runs = {}
    for line in (tmp_path / "calls").read_text().splitlines():
        if " train.py " in line:
            gpu, args = line.split(" ", 1)
            name = args.split("out_dir=")[1].split()[0].rsplit("/", 1)[1]
            runs[name] = gpu
            assert ("model.mlp_impl=quack" in args) == name.startswith("quack") and "model=370m" in args
            assert f"seed={name[-1]}" in args
    assert runs == {"bf16-s2": "0", "quack-s2": "1", "bf16-s3": "1", "quack-s3": "0"}
