import os

# Triton autotunes each kernel (the project's and FLA's) once per process: a minute or more for the FLA kernels of
# one backbone. Keep the timings in Triton's disk cache so that later processes (evaluations, sweeps) skip it.
os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")

# And skip it on a fresh machine too, where kernels/configs/ has this GPU's tuned configs (kernels/tuned_configs.py).
try:
    from .tuned_configs import install as _install_tuned_configs
    _install_tuned_configs()
except ImportError:  # no Triton (a CPU machine without it): nothing autotunes
    pass


def use_fla(name: str, q, impl: str | None) -> bool:
    """The ops that wrap FLA's kernels (recurrences, PaTH) share one impl convention: None (FLA on CUDA, the
    PyTorch reference elsewhere), "fla" or "torch"."""
    if impl not in (None, "torch", "fla"):
        raise ValueError(f"{name}: impl must be None, 'torch' or 'fla', got {impl!r}")
    if impl == "fla" and not q.is_cuda:
        raise ValueError(f"{name}: impl='fla' needs CUDA tensors (FLA's kernels are Triton GPU kernels)")
    return impl == "fla" or (impl is None and q.is_cuda)
