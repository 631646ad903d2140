#!/usr/bin/env bash
# Scaling over the GPUs of one node (1, 2, 4, 8): one record and one figure, drawn by benchmarks/scale_report.py.
#   throughput  tokens/s, MFU and peak memory a GPU at a fixed batch a GPU (micro_batch x seq_len, no accumulation):
#               370m/4096 GLA, Gated DeltaNet and transformer + RoPE under DDP and FSDP2; 1.3B transformer + RoPE and
#               GLA under FSDP2 with activation checkpointing; STEPS steps (default 30), the median past the first 10
#   loss        LOSS_STEPS (20) fp32 steps of 65,536 tokens without compile, 124m transformer + RoPE: each GPU count
#               against 1 GPU
#               (the same global batch, gradient accumulation making up the difference)
#   sweep       seed 004's S2 comparison (python train.py -m sweep=parity seed=0, EPOCHS, default 1) dealt out by
#               hydra/launcher=gpus to each count of GPUs in NGPUS: wall time of each
# Usage: bash benchmarks/scale.sh OUT [throughput|loss|sweep|all]   (checkpoints and data in WORK, default /tmp/scale)
# NGPUS (default: 1 and each power of 2 up to the GPUs present) sets the counts; SMALL and LARGE (";"-separated
# "backbone pe" pairs, empty for none) replace the throughput cases of each size, to split the record over calls.
# SMOKE=1 runs the same commands at the tiny size on the CPU with gloo (NGPUS default "1 2"), which is how
# tests/test_scale.py checks the script.
set -uo pipefail
out=${1:?usage: scale.sh OUT [throughput|loss|sweep|all]}
mode=${2:-all}
work=${WORK:-/tmp/scale}
mkdir -p "$out" "$work"
steps=${STEPS:-30}
if [ -n "${SMOKE:-}" ]; then
  gpus=${NGPUS:-1 2}
  echo "cpu (SMOKE=1: tiny models, gloo)" > "$out/device.txt"
  sizes=(tiny tiny) seq=64 lseq=64 micro=2 steps=${STEPS:-4} device=train.device=cpu compile=false
  small=("transformer rope") large=("gla nope")
else
  have=$(nvidia-smi -L | wc -l)
  gpus=${NGPUS:-$(n=1; while [ $n -le "$have" ]; do printf "%s " $n; n=$((n * 2)); done)}
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
  sizes=(370m 1_3b) seq=4096 lseq=1024 micro=8 device= compile=true
  small=("gla nope" "gated_deltanet nope" "transformer rope") large=("transformer rope" "gla nope")
fi
[ -n "${SMALL+set}" ] && IFS=';' read -ra small <<< "$SMALL"
[ -n "${LARGE+set}" ] && IFS=';' read -ra large <<< "$LARGE"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$out/device.txt"
common="logger.mode=disabled train.progress=false train.sample_tokens=0 train.eval_interval=100000
        train.ckpt_interval=100000 train.eval_tokens=$((seq * 2)) data.cache_dir=$work/cache $device"
keep() { cp "$work/$name/metrics.jsonl" "$out/$name.metrics.jsonl" 2>/dev/null; }  # the run's rows, into OUT
stopped() {  # a timeout or Ctrl-C: keep what the run in progress logged (it checkpoints and ends first) and the record
  # bash runs a trap only between commands, so each run is started in the background and waited for: the signal
  # reaches it at once (torchrun passes it to its workers) instead of after the run has ended by itself
  [ -n "${child:-}" ] && kill -TERM "$child" 2>/dev/null && wait "$child"
  [ -n "${name:-}" ] && keep
  python3 benchmarks/scale_report.py "$out" > /dev/null 2>&1
  exit 143
}
trap stopped TERM INT
run() {  # name nproc overrides...
  name=$1 n=$2; shift 2
  echo "=== $name ($n, started $(date +%T)): $*"
  rm -rf "$work/$name"  # a fresh run: train.py's resume=auto would continue a folder left by an earlier call
  python3 -m torch.distributed.run --standalone --nproc_per_node="$n" train.py $common out_dir=$work/$name "$@" \
    > "$out/$name.log" 2>&1 &
  child=$!; wait $child
  echo "rc=$?"; child=; grep -E "error|Error" "$out/$name.log" | tail -2
  keep
}
if [[ $mode == throughput || $mode == all ]]; then
  for n in $gpus; do
    batch="model.seq_len=$seq train.micro_batch=$micro train.global_batch_tokens=$((n * micro * seq)) train.steps=$steps
           train.log_interval=1 train.compile=$compile"
    for b in "${small[@]}"; do
      set -- $b
      for s in ddp fsdp; do
        run "tp_${sizes[0]}_$1_${s}_n$n" "$n" model=${sizes[0]} backbone=$1 pe=$2 train.strategy=$s $batch
      done
    done
    half=$(( micro / 2 > 0 ? micro / 2 : 1 ))
    for b in "${large[@]}"; do
      set -- $b
      run "tp_${sizes[1]}_$1_fsdp_n$n" "$n" model=${sizes[1]} backbone=$1 pe=$2 train.strategy=fsdp \
        train.activation_checkpointing=full $batch train.micro_batch=$half train.global_batch_tokens=$((n * half * seq))
    done
  done
fi
if [[ $mode == loss || $mode == all ]]; then
  lsize=124m; [ -n "${SMOKE:-}" ] && lsize=tiny
  for n in $gpus; do
    run "loss_n$n" "$n" model=$lsize train.steps=${LOSS_STEPS:-20} train.global_batch_tokens=$((8 * micro * lseq)) \
      train.micro_batch=$micro model.seq_len=$lseq train.log_interval=1 train.dtype=fp32 train.compile=false
  done
fi
if [[ $mode == sweep || $mode == all ]]; then
  # seed 004's S2 comparison (seed 0: GLA and transformer x NoPE, RoPE, Selective RoPE) as one -m command, its jobs
  # dealt out by hydra/launcher=gpus over GPUs 0..n-1 for each count n in NGPUS; PER_GPU (default 6) jobs at once
  # on a GPU
  tiny=()
  [ -n "${SMOKE:-}" ] && tiny=(backbone=transformer train.steps=2 train.epochs=null train.batch_size=16
    train.micro_batch=16 data.train_examples=64 data.test_examples=16 data.seq_len=16 data.eval_len=32
    train.eval_interval=2 model.d_model=32 model.n_heads=2 train.device=cpu)
  for k in $gpus; do
    g=$(seq -s , 0 $((k - 1))) t=$(date +%s)
    rm -rf "$work/sweep_$k"  # fresh: its jobs would resume (resume=auto) what an earlier call left there
    python3 train.py -m sweep=parity seed=0 train.epochs=${EPOCHS:-1} "${tiny[@]}" hydra/launcher=gpus \
      "hydra.launcher.gpus=[$g]" hydra.launcher.per_gpu=${PER_GPU:-6} hydra.sweep.dir=$work/sweep_$k \
      logger.mode=disabled train.progress=false > "$out/sweep_${k}gpu.log" 2>&1 &
    child=$!; wait $child
    rc=$? child=
    echo "{\"gpus\": $k, \"wall_s\": $(( $(date +%s) - t )), \"rc\": $rc}" | tee -a "$out/sweep.jsonl"
    cp "$work/sweep_$k/launcher.jsonl" "$out/sweep_${k}gpu.launcher.jsonl" 2>/dev/null
  done
fi
python3 benchmarks/scale_report.py "$out"
