"""benchmarks/mlp_numerics.py: a SwiGLU impl's output and gradients against float64 on the same bf16-rounded tensors."""

import pytest
from mlp_numerics import compare, main


def test_bf16_autocast_lands_at_bf16_rounding_and_repeats_exactly():
    r = compare(["inductor"], (3, 17), 64, 176, "cpu")["inductor"]
    assert set(r) == {"y", "dx", "dW13", "dW2"}
    for name, v in r.items():
        # bf16 has 8 mantissa bits: rounding the outputs alone gives ~2e-3; fp32 arithmetic would give ~1e-7, and
        # a wrong formula or layout (W_1 / W_3 swapped) ~1
        assert 1e-3 < v["rel"] < 1e-2, (name, v)
        # rounding errors are nearly orthogonal to the reference (|bias| 1-6% of rel here); a systematic shrink or
        # growth by a factor 1 + e puts e into both, so |bias| near rel
        assert abs(v["bias"]) < 0.25 * v["rel"] and v["repeat"] == 0, (name, v)


def test_quack_needs_cuda_and_the_package():
    with pytest.raises(SystemExit, match="--impls quack needs a CUDA GPU and quack-kernels"):
        main(["--impls", "quack", "--shapes", "1x8"])
