"""Shipped autotuning results (kernels/tuned_configs.py): a kernel whose tuning key is in the folder runs the shipped
config without timing any; the files are FLA's format (FLA's own loader reads them); stale or switched-off configs
are not used. The autotuned kernel runs in Triton's interpreter, where autotuning itself cannot run (no driver to
time with): an attempt to autotune fails the test."""

import json
import os

import pytest
import torch

import duality.kernels.tuned_configs as tc

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the interpreter (CPU CI)")


def make_kernel():
    """A fresh autotuned kernel (a new Autotuner each call) with two candidate configs: y = x + 1."""
    @triton.autotune([triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 32}, num_warps=2)],
                     key=["N"])
    @triton.jit
    def add_one(x, y, N, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + i, tl.load(x + i, mask=i < N) + 1, mask=i < N)
    return add_one


def run(kernel, n=100):
    x = torch.randn(n)
    y = torch.full_like(x, float("nan"))
    kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, n)
    return x, y


KEY = (100, "torch.float32", "torch.float32")  # Triton's key: the key arguments, then every tensor's dtype


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A config folder holding add_one's tuned entry for N = 100 (the second config), as a tuning run writes it."""
    monkeypatch.setattr(tc, "_created", [])  # this test's autotuners only
    k = make_kernel()
    k.cache[KEY] = k.configs[1]  # what autotuning on a GPU would have chosen
    assert tc.dump(tmp_path) == 1
    monkeypatch.setenv(tc.ENV, str(tmp_path))
    return tmp_path


@interp
def test_shipped_key_runs_without_autotuning(folder):
    k = make_kernel()
    assert k.cache[KEY] is k.configs[1]  # seeded at creation with the autotuner's own Config object
    before = tc.counts["benchmarks"]
    x, y = run(k)
    torch.testing.assert_close(y, x + 1, rtol=0, atol=0)
    assert tc.counts["benchmarks"] == before and k.best_config is k.configs[1]
    with pytest.raises(RuntimeError, match="driver"):  # a key that was not shipped autotunes (impossible here)
        run(k, n=50)
    assert tc.counts["benchmarks"] > before


def test_file_is_flas_format_and_flas_loader_reads_it(folder):
    data = json.loads((folder / "add_one.json").read_text())
    assert data["kernel_name"] == "add_one" and data["triton_version"] == triton.__version__
    (h, entry), = [(h, e) for h, e in data["autotune_entries"].items() if e["autotune_key"] == list(KEY)]
    assert entry["config"]["kwargs"] == {"BLOCK": 32} and entry["config"]["num_warps"] == 2
    assert entry["module"] == __name__
    cache = pytest.importorskip("fla.ops.utils.cache")
    assert h == cache.AutotuneKey.key_hash(KEY)
    old = cache.FLA_CACHE_MODE
    try:
        os.environ["FLA_CONFIG_DIR"] = str(folder)
        cache.FLA_CACHE_MODE = cache.FlaCacheMode.STRICT
        got = cache.load_cached_config("add_one", cache.AutotuneKey(KEY))
    finally:
        cache.FLA_CACHE_MODE = old
        os.environ.pop("FLA_CONFIG_DIR")
    assert got["kwargs"] == {"BLOCK": 32} and got["num_warps"] == 2
    assert got["num_stages"] == entry["config"]["num_stages"]


def test_dump_merges_and_keeps_existing_entries(folder):
    k = make_kernel()
    k.cache[(64, "torch.float32", "torch.float32")] = k.configs[0]
    assert tc.dump(folder) == 1  # only the new key; the shipped one is kept as it was
    entries = json.loads((folder / "add_one.json").read_text())["autotune_entries"].values()
    assert sorted(e["autotune_key"][0] for e in entries) == [64, 100]


def test_stale_config_other_module_and_off_are_not_used(folder, monkeypatch):
    path = folder / "add_one.json"
    data = json.loads(path.read_text())
    entry = next(iter(data["autotune_entries"].values()))
    entry["config"]["kwargs"] = {"BLOCK": 64}  # not a candidate of this kernel any more (another FLA version)
    path.write_text(json.dumps(data))
    tc._files.clear()
    assert not make_kernel().cache
    entry["config"]["kwargs"], entry["module"] = {"BLOCK": 32}, "fla.ops.other"  # another kernel of the same name
    path.write_text(json.dumps(data))
    tc._files.clear()
    assert not make_kernel().cache
    monkeypatch.setenv(tc.ENV, "off")
    assert tc.config_dir() is None


def test_unknown_folder_is_named(monkeypatch):
    monkeypatch.setenv(tc.ENV, "NO_SUCH_GPU")
    with pytest.raises(FileNotFoundError, match="NO_SUCH_GPU: no such folder; shipped:"):
        tc.config_dir()
