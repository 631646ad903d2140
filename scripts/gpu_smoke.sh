#!/usr/bin/env bash
# Smoke test and throughput of the foundation on a GPU machine (what the closing notes quote).
# Usage: bash scripts/gpu_smoke.sh OUT_DIR      (checkpoints go to /tmp; logs to OUT_DIR)
set -uo pipefail
out=${1:?usage: gpu_smoke.sh OUT_DIR}
mkdir -p "$out"
common="logger.mode=disabled train.progress=false train.sample_tokens=32"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/device.txt"
run() { name=$1; shift; echo "=== $name: $*"; rm -rf /tmp/runs/$name; python3 train.py "$@" $common out_dir=/tmp/runs/$name 2>&1 | tee "$out/$name.log" | grep -E "model:|train:|step +[0-9]+ \||sample:|error|Error" ; }
run 124m_compiled model=124m train.steps=30 train.log_interval=10 train.eval_interval=30 train.ckpt_interval=30
run 124m_eager model=124m train.steps=10 train.log_interval=5 train.eval_interval=10 train.ckpt_interval=10 train.compile=false
run tiny_alibi pe=alibi train.steps=20 train.log_interval=10
run tiny_xl pe=xl train.steps=20 train.log_interval=10
run tiny_linear backbone=linear_attn train.steps=20 train.log_interval=10
python3 eval.py ckpt=/tmp/runs/124m_compiled mode=perplexity eval_tokens=262144 2>&1 | tee "$out/eval.log"
python3 eval.py ckpt=/tmp/runs/124m_compiled mode=sample max_new_tokens=40 2>&1 | tail -3 | tee -a "$out/eval.log"
