import os

# Triton autotunes each kernel (the project's and FLA's) once per process: a minute or more for the FLA kernels of
# one backbone. Keep the timings in Triton's disk cache so that later processes (evaluations, sweeps) skip it.
os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
