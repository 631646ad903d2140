#!/usr/bin/env bash
# eval.py on a GPU (issue #6): two 124m models trained briefly on the embedded corpus (transformer + RoPE, GLA +
# NoPE), then every mode. Phase `train`: training, perplexity, sample, the adapter's scoring throughput
# (benchmarks/bench_lm_eval.py). Phase `eval`: position_loss (both on one plot), kernel pictures, and lm_eval on the
# local tasks (needs the datasets stack: pyarrow, pandas, datasets) plus a built-in task offline (its error).
# The two phases can run in two calls on one machine (the checkpoints stay in /tmp/eval_gpu_runs).
# Usage: [STEPS=200] bash scripts/eval_gpu.sh OUT [all|train|eval]
set -uo pipefail
OUT=${1:?usage: eval_gpu.sh OUT [all|train|eval]}; PHASE=${2:-all}; STEPS=${STEPS:-200}
RUNS=/tmp/eval_gpu_runs; mkdir -p "$OUT" $RUNS
CKPTS="[$RUNS/transformer-rope,$RUNS/gla-nope]"
quiet() { grep -v -E "WARNING|INFO|it/s\]|batch/s\]|Warning"; }
if [ "$PHASE" != eval ]; then
  for spec in transformer/rope gla/nope; do
    b=${spec%/*}; p=${spec#*/}
    rm -rf $RUNS/$b-$p  # a fresh run: resume=auto would continue an earlier call's folder
    python3 train.py backbone=$b pe=$p model=124m train.steps=$STEPS train.global_batch_tokens=131072 \
      train.micro_batch=16 train.log_interval=50 train.eval_interval=$STEPS train.ckpt_interval=100000 \
      train.compile=false train.sample_tokens=0 train.progress=false logger.mode=disabled out_dir=$RUNS/$b-$p \
      2>&1 | grep -E "^(model|train|step .*(val|00 \|))" | tee -a "$OUT/train.txt"
  done
  python3 eval.py "ckpt=$CKPTS" mode=perplexity out=$OUT/perplexity.json 2>&1 | quiet | tail -3
  python3 eval.py ckpt=$RUNS/transformer-rope mode=sample prompt="The module" max_new_tokens=40 temperature=0 \
    out=$OUT/sample.json 2>&1 | quiet | tail -3
  timeout 300 python3 benchmarks/bench_lm_eval.py $RUNS/transformer-rope $RUNS/gla-nope --batch-sizes 1 16 64 2>&1 \
    | tee "$OUT/bench_lm_eval.md"
fi
if [ "$PHASE" != train ]; then
  s=$SECONDS; python3 eval.py "ckpt=$CKPTS" mode=position_loss position_loss.max_windows=8 \
    micro_batch=1 out=$OUT/position_loss.json 2>&1 | quiet | tail -4; echo "position_loss: $((SECONDS - s)) s"
  python3 eval.py "ckpt=$CKPTS" mode=kernel kernel.length=1024 out=$OUT/kernels.json \
    'kernel.text="Return a new sorted list from the items in iterable. The module provides functions."' 2>&1 | quiet | tail -3
  if python3 -c "import pyarrow, pandas, datasets" 2>/dev/null; then
    export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
    s=$SECONDS; python3 eval.py "ckpt=$CKPTS" mode=lm_eval lm_eval.include_path=evals/local_tasks \
      'lm_eval.tasks=[pydoc_mc,pydoc_ppl,pydoc_complete]' lm_eval.batch_size=32 out=$OUT/lm_eval.json 2>&1 | quiet | tail -6; echo "lm_eval: $((SECONDS - s)) s"
    python3 eval.py ckpt=$RUNS/gla-nope mode=lm_eval 'lm_eval.tasks=[piqa]' out=$OUT/builtin.json 2>&1 \
      | grep -E "^error" | tee "$OUT/builtin_offline.txt"
  else
    echo "pyarrow/pandas/datasets not importable: lm_eval harness run skipped" | tee "$OUT/harness_skipped.txt"
  fi
fi
