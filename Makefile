# make train [group=option ... key=value ...]   train (Hydra overrides pass through, e.g. make train pe=alibi)
# make test                                     the test suite (what CI runs)
# make test-fast                                the suite without the tests marked slow: the inner loop (< 3 min)
# make gpu-test [GPU_TEST_ARGS="..."]            the GPU group on a CUDA machine (docs/tests.md): `PY=python3` runs it
#                                               in your own environment instead of .venv
# make bench [BENCH_ARGS="..."]                 the throughput suite on a GPU (docs/throughput)
# Both create .venv on first use. On a machine without nvidia-smi the CPU build of torch is installed first, so pip
# never pulls the multi-GB CUDA build; set TORCH_SPEC / TORCH_INDEX to choose another (see docs/install.md).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
PY ?= $(VENV)/bin/python
STAMP := $(VENV)/.installed
# with PY given on the command line (your own environment), make installs nothing
ENV := $(if $(filter command line,$(origin PY)),,$(STAMP))
GPU_TEST_ARGS ?= -n 8 --dist worksteal --timeout 300
# command-line overrides such as pe=alibi or optim.lr=1e-3 go to train.py
OVERRIDES := $(filter-out PYTHON=% VENV=% TORCH_SPEC=% TORCH_INDEX=% PYTEST_ARGS=% BENCH_ARGS=% PY=% GPU_TEST_ARGS=%,$(MAKEOVERRIDES))

.PHONY: train test test-fast gpu-test bench env clean
env: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1; then \
		echo "GPU machine: torch comes from pyproject.toml's dependencies"; \
	else \
		echo "CPU machine: installing $(TORCH_SPEC) (CPU build) first"; \
		$(PY) -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)); \
	fi
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

train: $(STAMP)
	$(PY) train.py $(OVERRIDES)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# the inner loop: every package's tests but those marked slow (subprocess runs, tests of 2 s or more); make test
# stays what CI runs
test-fast: $(STAMP)
	$(PY) -m pytest -m 'not gpu and not slow' -q $(PYTEST_ARGS)

# the GPU group, 8 processes sharing the GPU (compilation, not the GPU, is what takes the time); worksteal rebalances
# the tail, and a test past 300 s fails with its traceback instead of holding the group (docs/tests.md)
gpu-test: $(ENV)
	$(PY) -m pytest -m gpu tests/test_gpu.py --durations=15 $(GPU_TEST_ARGS)

# training steps of every backbone x scheme vs the nanoGPT reference, then the kernels, the attention kernel against
# its peers, the rotation kernel: tables, JSON and plots in docs/throughput, docs/attention
bench: $(ENV)
	$(PY) benchmarks/bench_train.py $(BENCH_ARGS)
	$(PY) benchmarks/bench_kernels.py
	$(PY) benchmarks/bench_attention.py --memory --out docs/attention
	$(PY) benchmarks/bench_rotary.py --json docs/throughput/bench_rotary.json

clean:
	rm -rf outputs cache wandb .pytest_cache
