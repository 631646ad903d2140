#!/usr/bin/env bash
# Seed 004's own code (timurcarstensen/selective-rope) beside this repo on one GPU, at the same protocol (docs/synthetic,
# "The seed's own code"). Nothing of the seed's code is kept in this repo: it is cloned into SEED_SRC (git-ignored)
# when absent, and run unchanged through reproductions/official_ab.py, which writes its S2 data and watches its evaluations.
#   bash reproductions/official_ab.sh OUT seed   # the seed's state_tracking main.py: S2, GLA + PES, SEEDS, each a process
#   bash reproductions/official_ab.sh OUT repo   # this repo's sweep=parity jobs for GLA + Selective RoPE at the same SEEDS
#   bash reproductions/official_ab.sh OUT copying  # the seed's copying main.py through reproductions/official_ab_copying.py: JOBS
#                                            # (default "selective_rope:0 nope:0"), evaluated every 500 steps, stopped
#                                            # after the last evaluation that fits LIMIT (its 5,000-step schedule kept)
# The seed's main.py runs its own S2 sweep's settings (configs/state_tracking: 1-layer GLA d 384, 12 heads, short
# convolutions, lr 5e-4, batch 1024, 100 epochs of cosine, bf16 weights; Selective RoPE with temperature 1, the bias,
# no phase gate) and has no resume: each run lasts one call, LIMIT seconds (default 540; DEADLINE, a Unix time, sets
# it after the setup), and its evaluations (one an epoch, 1,954 steps) are what it leaves. This repo's jobs resume from their checkpoints when run again.
# SEEDS (default "0 1 2"); PES, the seed's schemes (default selective_rope; nope too for its baseline), or JOBS, a
# list of scheme:seed ("selective_rope:0 nope:0"); GPUS ("0 1 2 3") deals the runs out in turn; DATA, where
# the seed's CSVs are written once (default /tmp/official_ab/data: 2M rows of 128 and 2,000 of 512, about 40 s);
# RUNS (default outputs/official_ab). OUT/<what>.tar.gz gets every run's records, not its checkpoints.
set -uo pipefail
OUT=${1:?usage: official_ab.sh OUT seed|copying|repo}
WHAT=${2:?usage: official_ab.sh OUT seed|copying|repo}
SEED_SRC=${SEED_SRC:-.seed/selective-rope}
SEED_COMMIT=d12e825
DATA=${DATA:-/tmp/official_ab/data}
RUNS=${RUNS:-outputs/official_ab}
LIMIT=${LIMIT:-540}
SEEDS=${SEEDS:-0 1 2}
# Threads per process: four runs of the seed's code on a 64-core host without this ran at 1.3 steps/s each, against
# about 29 in an earlier call that set OMP_NUM_THREADS=8 (2026-11-26, 4 x H200; that call also autotuned in each run
# instead of reading one shared autotuning cache, the other difference).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
mkdir -p "$OUT" "$RUNS"
case $WHAT in seed|copying|repo) ;; *) echo "unknown: $WHAT (seed, copying or repo)"; exit 2 ;; esac
if [ "$WHAT" != repo ] && [ ! -d "$SEED_SRC/synthetic_tasks" ]; then
  git clone -q https://github.com/timurcarstensen/selective-rope "$SEED_SRC" && git -C "$SEED_SRC" checkout -q $SEED_COMMIT \
    || { echo "no seed code at $SEED_SRC and it could not be cloned: fetch it there (commit $SEED_COMMIT)"; exit 2; }
fi
case $WHAT in
  seed)
    # its main.py finds its configs through the git repository around it (a copy without .git gets one)
    [ -e "$SEED_SRC/.git" ] || git -C "$SEED_SRC" init -q
    model_args=(model/position_embedding=selective_rope model.use_short_conv=true model.position_embedding.temp_theta=1.0
                model.position_embedding.use_bias=true model.position_embedding.use_gate=false)
    # while the data is written and tokenized: the model's kernels compiled into Triton's cache (the runs' first
    # step took 4-5 minutes without)
    python reproductions/official_ab.py warm "$SEED_SRC" "${model_args[@]}" >"$RUNS/warm.log" 2>&1 &
    warm=$!
    [ -f "$DATA/S2=512.csv" ] || python reproductions/official_ab.py data "$DATA" || exit 1
    # tokenized once into datasets' cache, where each run's get_dataset finds it (one process: minutes)
    [ -f "$DATA/.tokenized" ] || { python reproductions/official_ab.py prep "$SEED_SRC" "$DATA" --procs "${PROCS:-8}" \
                                     >"$RUNS/prep.log" 2>&1 && touch "$DATA/.tokenized"; } || { tail "$RUNS/prep.log"; exit 1; }
    wait $warm; tail -1 "$RUNS/warm.log"
    [ -n "${DEADLINE:-}" ] && LIMIT=$(( DEADLINE - $(date +%s) ))
    jobs=(${JOBS:-})
    [ ${#jobs[@]} -eq 0 ] && for seed in $SEEDS; do for pe in ${PES:-selective_rope}; do jobs+=("$pe:$seed"); done; done
    gpus=(${GPUS:-})
    n=0
    for job in "${jobs[@]}"; do
      pe=${job%:*} seed=${job#*:}
      name=seed-gla-$pe-s$seed
      on_gpu=()
      [ ${#gpus[@]} -gt 0 ] && on_gpu=(CUDA_VISIBLE_DEVICES=${gpus[$(( n % ${#gpus[@]} ))]})
      args=(data.group=S2 "data.data_dir=$DATA" trainer.lr=5e-4 trainer.logging=false)
      if [ "$pe" = selective_rope ]; then args+=("${model_args[@]}")
      else args+=("model/position_embedding=$pe" model.use_short_conv=true); fi
      rm -rf "${RUNS:?}/$name"
      echo "$name: ${on_gpu[*]} official_ab.py run $SEED_SRC $RUNS/$name --seed $seed ${args[*]}"
      { env "${on_gpu[@]}" timeout "$LIMIT" python reproductions/official_ab.py run "$SEED_SRC" "$RUNS/$name" --seed "$seed" "${args[@]}" \
          >"$RUNS/$name.log" 2>&1; echo $? >"$RUNS/$name.rc"; } &
      n=$((n + 1))
    done
    wait
    echo "seed: $n runs; exit codes (124: stopped at LIMIT, as planned):" $(cat "$RUNS"/seed-*.rc)
    tar -czf "$OUT/seed.tar.gz" --exclude=checkpoints --exclude='*.csv' -C "$RUNS" $(cd "$RUNS" && ls -d seed-*) ;;
  copying)
    deadline=$(( $(date +%s) + LIMIT - 15 ))
    [ -n "${DEADLINE:-}" ] && deadline=$(( DEADLINE - 15 ))
    gpus=(${GPUS:-}) n=0
    for job in ${JOBS:-selective_rope:0 nope:0}; do
      pe=${job%:*} seed=${job#*:}
      name=copy-seed-gla-$pe-s$seed
      on_gpu=()
      [ ${#gpus[@]} -gt 0 ] && on_gpu=(CUDA_VISIBLE_DEVICES=${gpus[$(( n % ${#gpus[@]} ))]})
      rm -rf "${RUNS:?}/$name" && mkdir -p "$RUNS/$name"
      echo "$name: ${on_gpu[*]} official_ab_copying.py run $SEED_SRC $RUNS/$name --seed $seed --pe $pe"
      { env "${on_gpu[@]}" timeout $(( deadline + 10 - $(date +%s) )) python reproductions/official_ab_copying.py run "$SEED_SRC" \
          "$RUNS/$name" --seed "$seed" --pe "$pe" --deadline "$deadline" >"$RUNS/$name/run.log" 2>&1
        echo $? >"$RUNS/$name/rc"; } &
      n=$((n + 1))
    done
    wait
    echo "copying: $n runs; exit codes:" $(cat "$RUNS"/copy-seed-*/rc)
    tar -czf "$OUT/copying.tar.gz" -C "$RUNS" $(cd "$RUNS" && ls -d copy-seed-*) ;;
  repo)
    RUNS=$RUNS/repo SEEDS="$SEEDS" ONLY=gla_st-selective EPOCHS=100 DEADLINE=$(( $(date +%s) + LIMIT )) \
      EXTRA="train.eval_interval=500 ${EXTRA:-}" bash scripts/synthetic_gpu.sh "$OUT" parity_gla ;;
esac
