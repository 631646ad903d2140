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


def _entries(*keyed):
    """write_entries' input for add_one: (key, its config's index in make_kernel's candidates) pairs."""
    configs = make_kernel().configs
    return {tc.key_hash(k): {"autotune_key": list(k), "module": __name__, "config": tc._config_dict(configs[i])}
            for k, i in keyed}


def test_a_sibling_gpus_folder_fills_the_keys_this_gpus_lacks_and_is_never_dumped_as_its_own(tmp_path, monkeypatch):
    """Seeding from [this GPU's folder, a sibling's]: a key in both takes this GPU's config, a key only the sibling
    has is seeded too but counted as borrowed, and dump() leaves it out (it was not tuned here)."""
    monkeypatch.setattr(tc, "_created", [])
    own, sibling = tmp_path / "own", tmp_path / "sibling"
    other = (64, "torch.float32", "torch.float32")
    tc.write_entries(own, "add_one", _entries((KEY, 1)))
    tc.write_entries(sibling, "add_one", _entries((KEY, 0), (other, 0)))
    k = make_kernel()  # no $ENV and no GPU: seeded from nothing at creation
    assert not k.cache
    before = dict(tc.counts)
    assert tc.seed(k, [own, sibling]) == 2
    assert k.cache[KEY] is k.configs[1] and k.cache[other] is k.configs[0] and k._duality_borrowed == {other}
    assert tc.counts["borrowed_keys"] - before["borrowed_keys"] == 1
    assert tc.counts["seeded_keys"] - before["seeded_keys"] == 2
    out = tmp_path / "dumped"
    assert tc.dump(out) == 1
    entries = json.loads((out / "add_one.json").read_text())["autotune_entries"].values()
    assert [e["autotune_key"] for e in entries] == [list(KEY)]


def test_siblings_are_the_shipped_folders_of_the_same_compute_capability(tmp_path, monkeypatch):
    for name in ("A", "B", "C"):
        (tmp_path / name).mkdir()
    monkeypatch.setattr(tc, "CONFIG_ROOT", tmp_path)
    monkeypatch.setattr(tc, "CAPABILITY", {"A": (9, 0), "B": (9, 0), "C": (8, 0), "D": (9, 0)})  # D: not shipped
    assert tc.siblings("A", (9, 0)) == [tmp_path / "B"]
    assert tc.siblings("H100_PCIe", (9, 0)) == [tmp_path / "A", tmp_path / "B"]  # a GPU with no folder of its own
    assert tc.siblings("A", (8, 0)) == [tmp_path / "C"] and tc.siblings("A", (12, 0)) == []
    # this GPU's folder first, then its siblings; a folder named in $ENV is used alone
    monkeypatch.setattr(tc, "gpu_name", lambda: "A")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.delenv(tc.ENV, raising=False)
    tc._config_dir.cache_clear()
    try:
        assert tc.config_dirs() == [tmp_path / "A", tmp_path / "B"]
        monkeypatch.setenv(tc.ENV, "C")
        assert tc.config_dirs() == [tmp_path / "C"]
    finally:
        tc._config_dir.cache_clear()


def test_every_shipped_folder_names_its_compute_capability():
    shipped = sorted(p.name for p in tc.CONFIG_ROOT.iterdir() if p.is_dir())
    assert shipped and set(shipped) <= set(tc.CAPABILITY), f"add {set(shipped) - set(tc.CAPABILITY)} to CAPABILITY"


@pytest.mark.slow
def test_tune_kernels_runs_each_workload_in_its_own_process(tmp_path):
    """A workload that crashes its process (here: no CUDA on this machine; on a GPU, an illegal memory access while
    timing a candidate) costs only itself: the next one still runs, and the run exits 1 naming both."""
    import subprocess
    import sys

    from conftest import ROOT
    r = subprocess.run([sys.executable, "scripts/tune_kernels.py", "--out", str(tmp_path), "--worker",
                        "state_tracking:gla", "mqar:retnet"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    assert "state_tracking:gla: failed" in r.stdout and "mqar:retnet: failed" in r.stdout
    assert "failed: state_tracking:gla mqar:retnet" in r.stdout


def test_tune_kernels_deals_its_processes_over_the_visible_gpus(monkeypatch):
    """--jobs N on a machine of several GPUs: process i gets the (i mod G)-th visible GPU alone; with one GPU or
    none the environment is left as it is (the processes share it)."""
    from tune_kernels import job_env  # scripts/ is on the path (conftest)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3,5")
    assert [job_env(i)["CUDA_VISIBLE_DEVICES"] for i in range(5)] == ["2", "3", "5", "2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert job_env(3)["CUDA_VISIBLE_DEVICES"] == "1"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr("torch.cuda.device_count", lambda: 4)
    assert [job_env(i).get("CUDA_VISIBLE_DEVICES") for i in range(5)] == ["0", "1", "2", "3", "0"]
    monkeypatch.setattr("torch.cuda.device_count", lambda: 0)
    assert "CUDA_VISIBLE_DEVICES" not in job_env(1)


@pytest.mark.slow
def test_every_370m_case_has_its_short_convolutions_shipped():
    """FLA's causal_conv1d is autotuned on the channels and kernel size it is called with, so a change of a mixer's
    convolution shapes needs a tuning pass: ab6bfcb split DeltaNet's one convolution in two and a fresh H200's first
    Gated DeltaNet step went from 35 to 77 s, 64 configs timed. Every bench_train case's 370m convolutions must have
    shipped entries, forward and backward, for each GPU in its folder or a sibling's of the same capability
    (tuned_configs borrows from those). The shapes are those the convolutions are called with in a forward of the
    built model (a few tokens on the CPU), so a new shape fails here, not on a rented GPU."""
    import bench_train
    from duality.model.core.layers import ShortConv
    convs = set()  # (case, channels, kernel size)
    for case in bench_train.CASES:
        model = bench_train.build(case, "370m", 4096, 512, overrides=["model.n_layer=1"])[0]
        for m in model.modules():
            if isinstance(m, ShortConv):
                m.register_forward_hook(lambda m, args, out, case=case: convs.add((case, args[0].shape[-1],
                                                                                   m.kernel_size)))
        with torch.no_grad():
            model(torch.randint(0, 512, (1, 8)))
    assert {c for c, *_ in convs} >= {"deltanet+nope", "gated_deltanet+nope", "gla+selective_rope"}
    missing = []
    for gpu, capability in tc.CAPABILITY.items():
        shipped = set()
        for folder in [tc.CONFIG_ROOT / gpu, *tc.siblings(gpu, capability)]:
            for kind in ("fwd", "bwd"):
                path = folder / f"causal_conv1d_{kind}_kernel.json"
                for e in json.loads(path.read_text())["autotune_entries"].values():
                    shipped.add((kind, *e["autotune_key"][:3]))  # channels, kernel size, the input's dtype
        missing += [f"{gpu} {case}: {kind} [{d}, {k}]" for case, d, k in sorted(convs) for kind in ("fwd", "bwd")
                    if (kind, d, k, "torch.bfloat16") not in shipped]
    assert not missing, f"not shipped (scripts/tune_kernels.py --only 370m on that GPU): {missing}"
