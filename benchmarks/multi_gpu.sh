#!/usr/bin/env bash
# Multi-GPU verification (issue #8) of the 124m transformer + RoPE, then benchmarks/multi_gpu_report.py compares runs.
#   curves   200 steps of 65,536-token batches (bf16, compiled): 1 GPU, 1 GPU with micro-batch 16 (other summation
#            order), 2 GPUs DDP, the 2-GPU run resumed from its step-100 checkpoint, 2 GPUs FSDP2
#   fp32     20 steps in fp32 without compile: 1 GPU, 2 GPUs DDP, 2 GPUs FSDP2 (equal up to summation order)
#   scaling  40 steps of 262,144-token batches (the embedded corpus holds 496 windows, fewer than the recipe's 512):
#            tokens/s on SCALE_GPUS (default 2) GPUs with DDP and FSDP2 (parameters kept gathered through the
#            micro-batches, train.fsdp_reshard=auto, and re-gathered for each, =true), then on 1 GPU (accum 8)
#   profile  DDP, FSDP2 and FSDP2 gathering in bf16 on SCALE_GPUS GPUs as in scaling, 3 steps traced at steady state
#            (after 28), each trace summarised by benchmarks/trace_summary.py (exposed communication, costliest kernels);
#            PROFILE picks the cases (default "ddp fsdp fsdp_bf16"; fsdp_prefetchK adds train.fsdp_prefetch=K)
#   dcp      sharded checkpoints (torch.distributed.checkpoint), fp32: 60 steps on 2 GPUs FSDP2, then its step-30
#            checkpoint resumed on 2 GPUs FSDP2 and on 1 GPU (2 -> 1), and the run again with asynchronous saves
#   cp       context parallelism, GLA + RoPE, 8,192-token sequences, fp32: 1 GPU, each sequence split over 2 and 4
#   longest  the longest GLA sequence (370m, bf16, full activation checkpointing) that trains one step on 1, 2 and 4
#            GPUs, one sequence split over them (benchmarks/longest_cp.py): a ladder by GPU memory, tried in order;
#            CASE=gated_deltanet+nope (bench_train's cases) another model, DOCS=8192 packed documents of that mean length
# Usage: bash benchmarks/multi_gpu.sh OUT_DIR [curves|fp32|scaling|profile|dcp|cp|longest|all]   (checkpoints in /tmp/mg; metrics in OUT_DIR)
set -uo pipefail
out=${1:?usage: multi_gpu.sh OUT_DIR [curves|fp32|scaling|all]}
mode=${2:-all}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$out/device.txt"
base="model=124m train.micro_batch=32 train.eval_interval=100000 train.eval_tokens=262144 train.sample_tokens=0
      train.progress=false logger.mode=disabled data.cache_dir=/tmp/mg/cache"
run() {  # name nproc overrides...
  name=$1 n=$2; shift 2
  echo "=== $name ($n GPU, started $(date +%T)): $*"
  # a fresh run (resume=auto would continue a folder left by an earlier call), unless keep=1 (a resume set up here)
  [ -n "${keep:-}" ] || rm -rf "/tmp/mg/$name"
  python3 -m torch.distributed.run --standalone --nproc_per_node="$n" train.py $base out_dir=/tmp/mg/$name "$@" \
    > "$out/$name.log" 2>&1
  echo "rc=$?"; grep -E "train:|step +[0-9]+0 \||error" "$out/$name.log" | tail -3
  cp /tmp/mg/$name/metrics.jsonl "$out/$name.metrics.jsonl" 2>/dev/null
}
python3 -c "from duality import data; from omegaconf import OmegaConf; data.prepare(OmegaConf.create({'name': 'embedded', 'tokenizer': 'bpe', 'vocab_size': 4096, 'cache_dir': '/tmp/mg/cache'}), progress=False)"
if [[ $mode == curves || $mode == all ]]; then
  c="train.steps=200 train.global_batch_tokens=65536 train.log_interval=10 train.ckpt_interval=100"
  run gpu1 1 $c
  run gpu1_micro16 1 $c train.micro_batch=16
  run gpu2_ddp 2 $c
  rm -rf /tmp/mg/gpu2_resume && mkdir -p /tmp/mg/gpu2_resume/checkpoints  # the 2-GPU run as if stopped after its step-100 checkpoint
  cp /tmp/mg/gpu2_ddp/checkpoints/step_0000100.pt /tmp/mg/gpu2_resume/checkpoints/
  keep=1 run gpu2_resume 2 $c
  run gpu2_fsdp 2 $c train.strategy=fsdp
fi
if [[ $mode == fp32 || $mode == all ]]; then
  c="train.steps=20 train.global_batch_tokens=65536 train.log_interval=1 train.ckpt_interval=100000 train.dtype=fp32 train.compile=false"
  run fp32_gpu1 1 $c
  run fp32_gpu2_ddp 2 $c
  run fp32_gpu2_fsdp 2 $c train.strategy=fsdp
fi
if [[ $mode == scaling || $mode == all ]]; then
  c="train.steps=40 train.global_batch_tokens=262144 train.log_interval=10 train.ckpt_interval=100000"
  n=${SCALE_GPUS:-2}  # the GPU count of the DDP / FSDP2 runs (2 or 4)
  run scale_gpu${n}_ddp $n $c
  run scale_gpu${n}_fsdp $n $c train.strategy=fsdp
  run scale_gpu${n}_fsdp_reshard $n $c train.strategy=fsdp train.fsdp_reshard=true  # re-gathered every micro-batch
  run scale_gpu1 1 $c
fi
if [[ $mode == profile ]]; then
  c="train.steps=40 train.global_batch_tokens=262144 train.log_interval=5 train.ckpt_interval=100000
     train.profile_steps=3 train.profile_after=28"  # untraced windows: the rows at steps 15, 20, 25
  n=${SCALE_GPUS:-2}
  for s in ${PROFILE:-ddp fsdp fsdp_bf16}; do  # fsdp_bf16: gathered in bf16; fsdp_prefetchK: train.fsdp_prefetch=K
    extra=(train.strategy=${s%%_*}); [[ $s == fsdp_bf16 ]] && extra+=(train.fsdp_param_dtype=bfloat16)
    # fsdp and fsdp_bf16: FSDP2's own order (train.fsdp_prefetch=0), as the earlier records measured them
    [[ $s == fsdp_prefetch* ]] && extra+=(train.fsdp_prefetch=${s#fsdp_prefetch}) || extra+=(train.fsdp_prefetch=0)
    run profile_gpu${n}_$s $n $c "${extra[@]}"
    python3 benchmarks/trace_summary.py /tmp/mg/profile_gpu${n}_$s/profile/trace.json \
      --json "$out/profile_gpu${n}_$s.summary.json" | tee "$out/profile_gpu${n}_$s.summary.txt"
  done
fi
if [[ $mode == dcp ]]; then
  c="train.steps=60 train.global_batch_tokens=65536 train.log_interval=1 train.ckpt_interval=30 train.keep_checkpoints=3
     train.dtype=fp32 train.compile=false train.checkpoint_format=sharded"
  run dcp_fsdp2 2 $c train.strategy=fsdp
  for n in 2 1; do  # the FSDP2 run as if stopped after its step-30 checkpoint, resumed on n GPUs
    rm -rf /tmp/mg/dcp_resume$n && mkdir -p /tmp/mg/dcp_resume$n/checkpoints && cp -r /tmp/mg/dcp_fsdp2/checkpoints/step_0000030 /tmp/mg/dcp_resume$n/checkpoints/
  done
  keep=1 run dcp_resume2 2 $c train.strategy=fsdp
  keep=1 run dcp_resume1 1 $c
  run dcp_async 2 $c train.strategy=fsdp train.async_checkpoint=true
  ls -R /tmp/mg/dcp_fsdp2/checkpoints /tmp/mg/dcp_async/checkpoints | tee "$out/dcp_checkpoints.txt"
fi
if [[ $mode == cp ]]; then
  c="backbone=gla pe=rope model.seq_len=8192 train.steps=10 train.global_batch_tokens=32768 train.micro_batch=4
     train.log_interval=1 train.eval_tokens=32768 train.ckpt_interval=100000 train.dtype=fp32 train.compile=false"
  run cp_gpu1 1 $c
  run cp_gpu2 2 $c train.context_parallel=2
  run cp_gpu4 4 $c train.context_parallel=4
fi
if [[ $mode == longest ]]; then  # the longest sequence that trains one step at 370m: 65,536 first, then a ladder
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # near the limit, fragmentation decides otherwise
  mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  if [ "$mem" -gt 100000 ]; then ladder="786432 819200 851968"; else ladder="393216 425984 458752"; fi
  for n in 1 2 4; do
    [ "$n" -gt "$(nvidia-smi -L | wc -l)" ] && break
    lengths=$(for x in $ladder; do printf "%s " $((x * n)); done)
    echo "=== ${CASE:-gla+nope} (documents ${DOCS:-0}) on $n GPU(s), started $(date +%T): 65536 $lengths"
    log="$out/longest_${CASE:-gla+nope}_${DOCS:-0}_$n.log"
    python3 -m torch.distributed.run --standalone --nproc_per_node=$n benchmarks/longest_cp.py --case "${CASE:-gla+nope}" \
      --documents "${DOCS:-0}" --steps 1 --lengths 65536 $lengths --out "$out/longest_cp.jsonl" > "$log" 2>&1
    grep -h " tokens " "$log" | tail -3
  done
  python3 benchmarks/longest_cp.py --report "$out/longest_cp.jsonl" --command "bash benchmarks/multi_gpu.sh OUT longest"
  exit 0
fi
python3 benchmarks/multi_gpu_report.py "$out"

