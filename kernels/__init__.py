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
