#!/usr/bin/env bash
# Each backbone at 124m size on the embedded corpus: 200 steps of 16 x 1024 tokens, bf16, through the FLA kernels.
# Prints the loss at steps 10 and the last step and the steady tokens/s.
# Usage: [PE=selective_rope] [STEPS=200] [COMPILE=false] bash scripts/train_backbones_gpu.sh OUT [backbone ...]
set -uo pipefail
out=${1:?usage: train_backbones_gpu.sh OUT [backbone ...]}; shift
mkdir -p "$out" /tmp/runs
backbones=${*:-transformer linear_attn gla deltanet gated_deltanet retnet mamba2 fox path path_fox gated_oja}
for b in $backbones; do
  pe=${PE:-rope}; [ -z "${PE:-}" ] && case $b in path|path_fox) pe=nope;; esac
  steps=${STEPS:-200}
  rm -rf /tmp/runs/$b-$pe-${COMPILE:-false}  # a fresh run: resume=auto would continue an earlier call's folder
  python3 train.py backbone=$b pe=$pe model=124m train.steps=$steps train.global_batch_tokens=16384 train.micro_batch=16 \
    train.log_interval=10 train.eval_interval=$steps train.ckpt_interval=100000 train.compile=${COMPILE:-false} train.sample_tokens=0 \
    train.progress=false logger.mode=disabled out_dir=/tmp/runs/$b-$pe-${COMPILE:-false} > "/tmp/runs/$b.log" 2>&1
  rc=$?
  first=$(grep -m1 -E "^step +10 \|" "/tmp/runs/$b.log" | awk '{print $5}')
  last=$(grep -E "^step +$steps \| loss" "/tmp/runs/$b.log" | awk '{print $5}')
  tps=$(grep -E "^step +$steps \| loss" "/tmp/runs/$b.log" | sed -E 's/.*\| ([0-9,]+) tok\/s.*/\1/')
  echo "$b pe=$pe compile=${COMPILE:-false} rc=$rc loss@10=$first loss@$steps=$last tok/s@$steps=$tps" | tee -a "$out/summary.txt"
  [ $rc -ne 0 ] && tail -5 "/tmp/runs/$b.log"
done
