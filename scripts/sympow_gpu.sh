#!/usr/bin/env bash
# Seed 003's architectures on a GPU (issue #5): the kernel tests on CUDA, then 124m sympow (p = 2, RoPE) and
# conformal-sympow (p = 2, gating + learned rotation) trained briefly on the embedded corpus (bf16, the fused
# kernel), and a few compiled steps of sympow + gating, p = 4, to show torch.compile runs through the kernel.
# Usage: [STEPS=200] bash scripts/sympow_gpu.sh OUT
set -uo pipefail
OUT=${1:?usage: sympow_gpu.sh OUT}; STEPS=${STEPS:-200}; mkdir -p "$OUT"
python3 -m pytest -q tests/test_attention.py tests/test_sympow.py 2>&1 | tail -2 | tee "$OUT/pytest.txt"
common="model=124m train.global_batch_tokens=131072 train.micro_batch=16 train.log_interval=50
  train.ckpt_interval=100000 train.sample_tokens=0 train.progress=false logger.mode=disabled"
rm -rf /tmp/sympow_runs  # fresh runs: resume=auto would continue an earlier call's folders
for arch in sympow conformal_sympow; do
  python3 train.py arch=$arch $common train.steps=$STEPS train.eval_interval=$STEPS train.compile=false \
    out_dir=/tmp/sympow_runs/$arch 2>&1 | grep -E "^(model|train|step .*(val|00 \|))" | tee -a "$OUT/train.txt"
done
python3 train.py arch=sympow_gating backbone.power=4 $common train.steps=20 train.eval_interval=20 \
  train.compile=true out_dir=/tmp/sympow_runs/compiled 2>&1 | grep -E "^(model|train|step .*(val|20 \|))|Error" \
  | tee -a "$OUT/train.txt"
