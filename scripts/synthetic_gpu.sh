#!/usr/bin/env bash
# The GPU runs behind the synthetic-task results in docs/synthetic: each job a process of its own, all of a set at
# once on one GPU (small models leave most of an H100 idle), continuing from their checkpoints when run again:
#   bash scripts/synthetic_gpu.sh OUT parity      # S2: 1-layer GLA (gla_st) and Transformer x {nope, rope, selective_rope_st}
#   bash scripts/synthetic_gpu.sh OUT parity_gla  # S2: only GLA's three
#   bash scripts/synthetic_gpu.sh OUT a3          # A3: 2-layer DeltaNet x {nope, rope, selective_rope_st}
#   bash scripts/synthetic_gpu.sh OUT mqar        # MQAR, task=mqar's BaseConv + GLA x {nope, rope, selective_rope}
#                                                 # x SETTINGS (default "64:4 128:8 256:16") x DMODELS ("64 128 256")
#   bash scripts/synthetic_gpu.sh OUT copying     # copying (task=copying: the seed's packed data), GLA x PES
#                                                 # (default "nope rope selective_rope_copy"; a variant:
#                                                 # selective_rope_copy+phase_gate=true+bias=true)
# Budget: EPOCHS (default 2) of the task's training examples with the task's own schedule over them, or STEPS.
# SEEDS (default 0), LRS (a comma list; default: the task's lr) and EXTRA (more Hydra overrides, e.g.
# train.time_limit=400: each job checkpoints and pauses then, to go on when run again) apply to every job; ONLY (a
# regex on job names) keeps some; PARALLEL (default: all) caps the jobs running at once (MQAR (256, 16) at d_model 64
# on the H100, 2026-11-25: 18 at once fit, 2.2 GiB logged a job; 24 at once ran out of memory at evaluation);
# DEADLINE (a Unix time) gives each job the train.time_limit that ends it by then and starts no job in the last
# minute; GPUS (e.g. "0 1") deals the jobs out to those GPUs in turn (CUDA_VISIBLE_DEVICES), PARALLEL then counting
# jobs on all of them; NPROC (default 1) runs each job data-parallel over that many processes (torchrun, DDP: the
# same global batch, one long run sooner), each job then getting the next NPROC of GPUS. Runs live in RUNS (default
# outputs/synthetic); a job whose folder has a checkpoint resumes from it (resume=auto), so a sweep longer than one
# sitting is this command repeated; a job with a task_eval.json is finished and not started again. At the end
# OUT/<what>.tar.gz holds every run's metrics, task_eval.json and plots (no checkpoints) and
# scripts/collect_sweep.py's table and figures.
set -uo pipefail
OUT=${1:?usage: synthetic_gpu.sh OUT parity|parity_gla|a3|mqar|copying}
WHAT=${2:?usage: synthetic_gpu.sh OUT parity|parity_gla|a3|mqar|copying}
RUNS=${RUNS:-outputs/synthetic}
budget=(train.epochs=${EPOCHS:-2})
[ -n "${STEPS:-}" ] && budget=(train.steps=$STEPS train.epochs=null)
# One CPU thread a job: with PyTorch's default (a thread per core) two dozen small jobs on 16 cores ran 1.6x slower
# in all (docs/synthetic, MQAR). OMP_NUM_THREADS set by the caller wins.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
common=(logger.mode=disabled train.progress=false "${budget[@]}" ${EXTRA:-})
jobs=()  # "name|overrides..."
case $WHAT in
  parity|parity_gla)
    bbs="gla_st"; [ "$WHAT" = parity ] && bbs="gla_st transformer"
    for b in $bbs; do for p in nope rope selective_rope_st; do
      jobs+=("s2-$b-$p|task=state_tracking data=parity backbone=$b pe=$p"); done; done ;;
  a3)
    for p in nope rope selective_rope_st; do
      jobs+=("a3-deltanet-$p|task=state_tracking data=a3 backbone=deltanet model.n_layer=2 pe=$p"); done ;;
  mqar)
    for st in ${SETTINGS:-64:4 128:8 256:16}; do L=${st%:*} K=${st#*:}
      for d in ${DMODELS:-64 128 256}; do for p in nope rope selective_rope; do
        jobs+=("mqar${L}x$K-d$d-gla-$p|task=mqar backbone=gla pe=$p data.seq_len=$L data.num_kv_pairs=$K model.d_model=$d")
      done; done; done ;;
  copying)
    for p in ${PES:-nope rope selective_rope_copy}; do  # a scheme, or scheme+option=value+...: a variant
      name=${p//+/-}; name=${name//=/}; name=${name//pe./}
      jobs+=("copy-gla-$name|task=copying backbone=gla backbone.expand_k=1.0 pe=${p//+/ pe.}"); done ;;
  *) echo "unknown: $WHAT"; exit 2 ;;
esac
gpus=(${GPUS:-})
nproc=${NPROC:-1}
[ ${#gpus[@]} -gt 0 ] && [ $(( ${#gpus[@]} % nproc )) -ne 0 ] && {
  echo "GPUS (${gpus[*]}) is not a multiple of NPROC=$nproc: each job takes NPROC of them"; exit 2; }
launch=(python)
[ "$nproc" -gt 1 ] && launch=(python -m torch.distributed.run --standalone --nproc_per_node="$nproc")
mkdir -p "$OUT" "$RUNS/$WHAT"
n=0
for seed in ${SEEDS:-0}; do
  for lr in $(echo "${LRS:-task}" | tr , ' '); do
    for j in "${jobs[@]}"; do
      name=${j%%|*}-s$seed; [ "$lr" != task ] && name+=-lr$lr
      [ -n "${ONLY:-}" ] && [[ ! $name =~ $ONLY ]] && continue
      [ -f "$RUNS/$WHAT/$name/task_eval.json" ] && { echo "$name: finished before"; continue; }
      args=(${j#*|} seed=$seed out_dir=$RUNS/$WHAT/$name resume=auto "${common[@]}")
      [ "$lr" != task ] && args+=(optim.lr=$lr)
      while [ -n "${PARALLEL:-}" ] && [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do wait -n; done
      if [ -n "${DEADLINE:-}" ]; then
        left=$((DEADLINE - $(date +%s))); [ $left -lt 60 ] && { echo "$name: not started (deadline)"; continue; }
        args+=(train.time_limit=$((left - 20)))
      fi
      on_gpu=()
      if [ ${#gpus[@]} -gt 0 ]; then  # the next NPROC GPUs, in turn
        first=$(( n * nproc % ${#gpus[@]} ))
        group=$(IFS=,; echo "${gpus[*]:first:nproc}")
        on_gpu=(CUDA_VISIBLE_DEVICES=$group)
      fi
      echo "$name: ${on_gpu[*]} ${launch[*]} train.py ${args[*]}"
      rm -f "$RUNS/$WHAT/$name.rc"
      { env "${on_gpu[@]}" "${launch[@]}" train.py "${args[@]}" >>"$RUNS/$WHAT/$name.log" 2>&1
        echo $? >"$RUNS/$WHAT/$name.rc"; } &
      n=$((n + 1))
    done
  done
done
wait
fail=$(cat "$RUNS/$WHAT"/*.rc 2>/dev/null | grep -cv '^0$')
echo "$WHAT: $n jobs, $fail ended non-zero"
python scripts/collect_sweep.py "$RUNS/$WHAT" --out "$RUNS/$WHAT" || true
tar -czf "$OUT/$WHAT.tar.gz" --exclude=checkpoints -C "$RUNS" "$WHAT"
