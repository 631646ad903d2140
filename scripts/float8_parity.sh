#!/usr/bin/env bash
# Loss parity of float8 training (issue #50): the 1.3B transformer + RoPE, bf16 and train.float8=${RECIPE:-tensorwise},
# seeds SEEDS ("0 1") each, STEPS (2000) steps of 8,192 tokens (2 x 4096) at lr 3e-4 on Python sources packed as
# LongCrawl64-style arrays (DATA_DIR, made by scripts/float8_parity.py corpus / pack), validation every 100 steps.
# The runs start at once, dealt to the GPUs in turn (two 1.3B runs of ~40 GiB share an H200 on a 2-GPU machine); more
# seeds on another machine: SEEDS="2 3", then `float8_parity.py report` over all the run folders.
# Stopped by a signal (`timeout -s TERM`), each run checkpoints; the same command then continues the unfinished ones.
# Another setting against the default, the same way: NAME (its runs' label, default $RECIPE), VARIANT (its Hydra
# overrides, space-separated; default train.float8=$RECIPE), MODEL (default 1_3b); the default's runs stay
# bf16-s<seed>.
# Usage: bash scripts/float8_parity.sh OUT_DIR DATA_DIR   (runs in RUNS, default /tmp/f8/runs; the record and the
#        plot in OUT_DIR)   e.g. NAME=quack VARIANT=model.mlp_impl=quack MODEL=370m bash scripts/float8_parity.sh ...
set -uo pipefail
out=${1:?usage: float8_parity.sh OUT_DIR DATA_DIR} root=${2:?usage: float8_parity.sh OUT_DIR DATA_DIR}
steps=${STEPS:-2000} seeds=${SEEDS:-0 1} recipe=${RECIPE:-tensorwise} model=${MODEL:-1_3b} runs=${RUNS:-/tmp/f8/runs}
name=${NAME:-$recipe} variant=${VARIANT:-train.float8=$recipe}
mkdir -p "$out" "$runs"
data="data=longcrawl64 data.root=$root data.doc_len=4096 data.tokenizer=$root/tokenizer.json data.bos_id=$(cat $root/bos.txt)"
ngpu=$(nvidia-smi -L | wc -l) i=0
for run in $(for s in $seeds; do echo bf16-s$s $name-s$s; done); do
  r=${run%-s*} s=${run##*-s} i=$((i + 1))
  # the runs dealt round the GPUs, one GPU further on each round: with more runs than GPUs each GPU runs defaults and
  # variants alike, so nothing of one GPU can pass for the setting's effect
  gpu=$(((i - 1 + (i - 1) / ngpu) % ngpu))
  grep -qs "\"step\": $steps, \"val_loss\"" $runs/$run/metrics.jsonl && continue  # finished
  # shellcheck disable=SC2086  # $variant: one or more overrides
  CUDA_VISIBLE_DEVICES=$gpu python3 train.py model=$model $data seed=$s out_dir=$runs/$run \
    $([ "$r" = bf16 ] || echo "$variant") train.steps=$steps train.global_batch_tokens=8192 \
    train.micro_batch=2 train.activation_checkpointing=none optim.lr=3e-4 train.eval_interval=100 \
    train.eval_tokens=131072 train.log_interval=20 train.ckpt_interval=100000 train.sample_tokens=0 \
    train.progress=false logger=none >> "$out/$run.log" 2>&1 &
done
wait
for run in "$runs"/*; do echo "$(basename $run): $(tail -n 1 $out/$(basename $run).log)"; done
python3 scripts/float8_parity.py report "$runs" --record "$out/${name}_parity.json" --plot "$out/${name}_parity.png" \
  --note "bash scripts/float8_parity.sh OUT (STEPS=$steps MODEL=$model NAME=$name VARIANT=$variant) on \
$(nvidia-smi -L | head -1 | cut -d'(' -f1)"
