"""Shipped Triton autotuning results: no first-call autotuning on the GPUs we have tuned for.

FLA autotunes each of its kernels on first call, per distinct tuning key (head count, head sizes, chunk size, dtypes,
varlen or not): 1-5 minutes per backbone on a fresh H100, paid again on every new machine. `scripts/tune_kernels.py`
runs the shapes this repo uses once per GPU model and writes the winners to `kernels/configs/<GPU>/<kernel>.json`, in
FLA 0.6's own config-file format (`fla/ops/utils/cache.py`: `autotune_entries` keyed by the md5 of the tuning key).

Loading: every `triton.runtime.autotuner.Autotuner` created after `import kernels` (that is, every FLA kernel, since
FLA is imported lazily by the dispatch functions) gets its cache seeded with the shipped entries for its kernel name,
module and exact tuning key, each resolved to one of that autotuner's own candidate configs (pre-hooks included), so
Triton's `run` finds the key and benchmarks nothing. A key that was not tuned autotunes as before.

Why not FLA's loader (`FLA_CONFIG_DIR` + `FLA_CACHE_MODE`): it only covers kernels decorated with FLA's
`fla_cache_autotune` (62 of FLA 0.6's ~260 autotuned kernels; `chunk_h`, `solve_tril`, the cumsums and the norms use
plain `triton.autotune`), and `configure_fla_cache_autotune()` would have to run before `import fla`, which
FLA's own package `__init__` makes impossible. The files stay readable by FLA's loader for its own kernels:
`FLA_CONFIG_DIR=kernels/configs/<GPU> FLA_CACHE_MODE=strict`.

A key this GPU's folder lacks is taken from the shipped folder of another GPU with the same compute capability
(CAPABILITY): the same instruction set and shared memory per SM, so the same configs compile and fit, tuned on a
sibling rather than here (a fresh H200 then times no config for a shape only the H100 was tuned at). Such keys are
counted apart (counts["borrowed_keys"]) and never dumped as this GPU's own.

Switches (environment): `DUALITY_KERNEL_CONFIGS=off` disables seeding (autotune as FLA does);
`DUALITY_KERNEL_CONFIGS=<folder or GPU name>` uses that folder alone (e.g. to tune what this GPU's folder lacks
rather than borrow it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
from pathlib import Path

from duality.common.io import write_atomic

CONFIG_ROOT = Path(__file__).resolve().parent / "configs"
ENV = "DUALITY_KERNEL_CONFIGS"
DUMP_ENV = "DUALITY_TUNE_OUT"  # a folder: runs write what they autotuned under it (scripts/tune_kernels.py --merge)

_created: list = []  # every autotuner made since install(): what dump() writes
counts = {"seeded_kernels": 0, "seeded_keys": 0, "borrowed_keys": 0,  # borrowed: seeded from a sibling GPU's folder
          "benchmarks": 0}  # benchmarks: configs timed by autotuning here
# each shipped folder's compute capability (tests/test_tuned_configs.py checks every folder is listed)
CAPABILITY = {"NVIDIA_H100_80GB_HBM3": (9, 0), "NVIDIA_H200": (9, 0)}
_files: dict[Path, dict] = {}


@functools.lru_cache(maxsize=1)
def gpu_name() -> str | None:
    """The current CUDA device's name as FLA sanitises it ("NVIDIA H100 80GB HBM3" -> "NVIDIA_H100_80GB_HBM3")."""
    import torch
    if not torch.cuda.is_available():
        return None
    return re.sub(r"[^0-9A-Za-z]+", "_", torch.cuda.get_device_name(torch.cuda.current_device())).strip("_")


def config_dir() -> Path | None:
    """The folder the configs are read from: $DUALITY_KERNEL_CONFIGS (a path or a GPU folder name under
    kernels/configs), else kernels/configs/<this GPU>; None when switched off or when no folder exists."""
    return _config_dir(os.environ.get(ENV, ""))


@functools.lru_cache(maxsize=8)
def _config_dir(choice: str) -> Path | None:
    if choice.lower() in ("off", "0", "false", "none"):
        return None
    if choice:
        d = Path(choice) if os.sep in choice or Path(choice).is_dir() else CONFIG_ROOT / choice
        if not d.is_dir():
            raise FileNotFoundError(f"{ENV}={choice}: no such folder; shipped: "
                                    f"{sorted(p.name for p in CONFIG_ROOT.glob('*/'))}")
        return d
    name = gpu_name()
    d = None if name is None else CONFIG_ROOT / name
    return d if d is not None and d.is_dir() else None


def config_dirs() -> list[Path]:
    """The folders seeding reads, in order: config_dir(), then, where the folder was not chosen by $ENV, the shipped
    folders of the other GPUs with this GPU's compute capability (for the keys the first lacks)."""
    own = config_dir()
    if os.environ.get(ENV) or gpu_name() is None:
        return [own] if own else []
    import torch
    return ([own] if own else []) + siblings(gpu_name(), torch.cuda.get_device_capability())


def siblings(name: str, capability: tuple) -> list[Path]:
    """The shipped folders of GPUs other than `name` with this compute capability, in CAPABILITY's order."""
    return [CONFIG_ROOT / n for n, c in CAPABILITY.items()
            if n != name and tuple(c) == tuple(capability) and (CONFIG_ROOT / n).is_dir()]


def key_hash(key) -> str:
    """FLA's entry id: the md5 of the key as compact, sorted JSON (tuples as lists)."""
    return hashlib.md5(json.dumps(_plain(key), separators=(",", ":"), sort_keys=True).encode()).hexdigest()


def _plain(x):
    return [_plain(v) for v in x] if isinstance(x, (list, tuple)) else x


def _tuple(x):
    return tuple(_tuple(v) for v in x) if isinstance(x, list) else x


def _kernel(tuner):
    """(function name, module) of the Python function under an autotuner (heuristics and the JIT function wrap it;
    the name is FLA's config-file name)."""
    fn = tuner.fn
    while hasattr(fn, "fn"):
        fn = fn.fn
    return fn.__name__, fn.__module__


def _config_dict(cfg) -> dict:
    return {"kwargs": dict(cfg.kwargs), "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
            "num_ctas": getattr(cfg, "num_ctas", 1), "maxnreg": getattr(cfg, "maxnreg", None)}


def _same(cfg, d) -> bool:
    return (dict(cfg.kwargs) == d["kwargs"] and cfg.num_warps == d["num_warps"]
            and cfg.num_stages == d["num_stages"] and getattr(cfg, "num_ctas", 1) == d.get("num_ctas", 1)
            and getattr(cfg, "maxnreg", None) == d.get("maxnreg"))


def _file(folder: Path, name: str) -> dict:
    path = folder / f"{name}.json"
    if path not in _files:
        _files[path] = json.loads(path.read_text()) if path.exists() else {}
    return _files[path]


def seed(tuner, folders: list[Path]) -> int:
    """Put the shipped entries for this autotuner's kernel into its cache from these folders (a key from the first
    that has it; keys from all but the first are the tuner's `_duality_borrowed`); returns how many keys were
    seeded."""
    if not folders or len(tuner.configs) < 2:
        return 0
    name, module = _kernel(tuner)
    n, borrowed = 0, set()
    for i, folder in enumerate(folders):
        for entry in _file(folder, name).get("autotune_entries", {}).values():
            key = _tuple(entry["autotune_key"])
            if entry.get("module", module) != module or key in tuner.cache:
                continue  # another kernel of the same name, or a key an earlier folder gave
            cfg = next((c for c in tuner.configs if _same(c, entry["config"])), None)
            if cfg is not None:  # a config this FLA version no longer offers is re-tuned instead
                tuner.cache[key] = cfg
                n += 1
                if i:
                    borrowed.add(key)
    tuner._duality_borrowed = borrowed
    counts["seeded_keys"] += n
    counts["borrowed_keys"] += len(borrowed)
    counts["seeded_kernels"] += n > 0
    return n


def install():
    """Seed every autotuner created from now on (and those of FLA modules already imported). Idempotent."""
    from triton.runtime.autotuner import Autotuner
    if getattr(Autotuner.__init__, "_duality", False):
        return
    init = Autotuner.__init__

    def __init__(self, *args, **kwargs):  # the folder is resolved here: FLA's import has initialised CUDA by now
        init(self, *args, **kwargs)
        track(self)
        seed(self, config_dirs())

    __init__._duality = True
    Autotuner.__init__ = __init__
    for mod in [m for n, m in list(sys.modules.items()) if n == "fla" or n.startswith("fla.")]:
        for obj in list(vars(mod).values()):
            while obj is not None and not isinstance(obj, Autotuner) and type(obj).__name__ == "Heuristics":
                obj = obj.fn
            if isinstance(obj, Autotuner) and obj not in _created:
                track(obj)
                seed(obj, config_dirs())


def track(tuner):
    """Remember the autotuner (for dump) and count the configs it benchmarks (counts["benchmarks"])."""
    bench = tuner._bench

    def counted(*args, **kwargs):
        counts["benchmarks"] += 1
        return bench(*args, **kwargs)

    tuner._bench = counted
    _created.append(tuner)


def autotuners() -> list:
    return list(_created)


def write_entries(folder: Path, name: str, entries: dict, triton_version: str | None = None) -> int:
    """Merge entries {id: {autotune_key, module, config}} into folder/<name>.json (FLA's format; entries already
    there win), written atomically. Returns how many were added."""
    import triton
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    have = data.get("autotune_entries", {})
    new = {h: e for h, e in entries.items() if h not in have}
    if not new and path.exists():
        return 0
    data = {"kernel_name": name, "triton_version": data.get("triton_version") or triton_version or triton.__version__,
            "autotune_entries": dict(sorted({**have, **new}.items()))}
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    _files.pop(path, None)
    return len(new)


def dump_requested(name: str) -> int:
    """dump() into $DUALITY_TUNE_OUT/<name> when that is set (a GPU test worker, a first-step case, a train.py run);
    0 otherwise."""
    out = os.environ.get(DUMP_ENV)
    return dump(Path(out) / name) if out else 0


def dump(folder: Path) -> int:
    """Merge every autotuner's cache (what this process tuned or was seeded with, not what it borrowed from a
    sibling GPU's folder) into folder/<kernel>.json. Returns the number of entries added."""
    by_name: dict[str, dict] = {}
    for t in _created:
        if len(t.configs) < 2:
            continue
        name, module = _kernel(t)
        entries = by_name.setdefault(name, {})
        for key, cfg in t.cache.items():
            if key in getattr(t, "_duality_borrowed", ()):
                continue
            h = key_hash(key)
            if h in entries and entries[h]["module"] != module:
                h = f"{h}@{module}"  # two kernels of one name with the same key
            entries[h] = {"autotune_key": _plain(key), "module": module, "config": _config_dict(cfg)}
    return sum(write_entries(folder, name, entries) for name, entries in sorted(by_name.items()) if entries)
