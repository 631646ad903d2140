#!/usr/bin/env bash
# The results page's sweeps (docs/results/README.md) in one allocation of SECONDS (a Slurm job's time limit, a GPU
# lease): each task's grid and seeds launched side by side on the visible GPUs, which share each GPU's places
# (hydra.launcher.per_gpu, default 8; a launch starts once the one before has dealt every job, which so takes the
# places first), a job started only if it should end 90 s before the allocation does (hydra.launcher.finish_by, from
# the run lengths in launcher.jsonl and the record), each sweep going on from where its folders and its record
# (docs/results/<task>.json) left it. Run it again in the next allocation.
#   bash scripts/results_sweeps.sh SECONDS [TASK ...]     TASK: s2, retrieval, mqar (default: s2 retrieval), or
#                                                         another sweep config's name, one launch (e.g. s2_negeig)
# EXTRA: more Hydra overrides for every launch (e.g. hydra.launcher.per_gpu=12; a sweep key given there replaces the
# config's, so "hydra.launcher.per_gpu=8 backbone=path,path_fox" runs those backbones' jobs alone, at 8 a GPU, where
# their long runs fit in the allocation); SWEEPS_DIR: where the sweep folders
# go (default outputs/results, the configs' own), with each launch's log, SWEEPS_DIR/<task>-{grid,seeds}.log (another
# sweep's: SWEEPS_DIR/<name>, SWEEPS_DIR/<name>.log; its first in the list takes the GPUs' places first). (Not
# OUT, its first name: a job environment's own OUT, e.g. a lease's output folder, once sent the sweeps there.) A
# seeds job whose pair's grid has not finished waits (WAITING, best_lr's reason in the launch's summary: no process,
# no GPU place); once every launch has ended, each launch that left jobs waiting goes once more if time is left (the
# grids are then as far as this allocation takes them), so one long allocation trains a pair's grid and its seeds;
# what still waits runs in a later allocation. Then:
#   python scripts/results.py collect <task> outputs/results/<task> --device ...   (the page's record)
#   python scripts/collect_sweep.py outputs/results/<name> --out docs/results/<name>  (another sweep's table)
set -uo pipefail
seconds=${1:?usage: results_sweeps.sh SECONDS [TASK ...]}
shift
tasks=("$@")
[ ${#tasks[@]} -eq 0 ] && tasks=(s2 retrieval)
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -gt 90 ]] || { echo "SECONDS=$seconds: the allocation's length, > 90" >&2; exit 2; }
end=$(( $(date +%s) + seconds - 90 ))
out=${SWEEPS_DIR:-outputs/results}
cd "$(dirname "$0")/.."
launches=()  # sweep config:folder:log, in order: a results task's grid then its seeds; another sweep alone
for t in "${tasks[@]}"; do
  if [ -f "conf/sweep/results_${t}.yaml" ]; then
    launches+=("results_${t}:$t:$t-grid" "results_${t}_seeds:$t:$t-seeds")
  elif [ -f "conf/sweep/${t}.yaml" ] && [[ "$t" != results_* ]]; then
    launches+=("$t:$t:$t")
  else
    echo "no task $t: choose from $(ls conf/sweep/results_*_seeds.yaml | sed 's|.*/results_||; s|_seeds.yaml||' |
      tr '\n' ' ')or a sweep of conf/sweep/ (one launch)" >&2; exit 2
  fi
done
mkdir -p "$out"
rc=0
dealt() { tr '\r' '\n' < "$1" 2>/dev/null | grep -c "every job dealt"; }
run_round() {  # the launches named ("$@"), side by side, each with finish_by at the allocation's end; waits for them
  local pids=() l sweep dir name left before
  for l in "$@"; do
    IFS=: read -r sweep dir name <<< "$l"
    left=$(( end - $(date +%s) ))
    [ "$left" -gt 0 ] || break
    before=$(dealt "$out/$name.log")  # the again-round appends to the first round's log
    # OMP_NUM_THREADS=1: a GPU's 8 jobs of each launch would otherwise share the cores 8 x launches ways
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} ${PYTHON:-python} train.py -m "sweep=$sweep" hydra/launcher=gpus \
      logger=none "hydra.sweep.dir=$out/$dir" "hydra.launcher.finish_by=$left" ${EXTRA:-} >> "$out/$name.log" 2>&1 &
    pids+=($!)
    echo "$(date -u +%H:%M:%S) sweep=$sweep: finish_by=${left}s, log $out/$name.log"
    # the earlier launch's jobs first in the GPUs' places (a grid's before its seeds): the next launch starts once
    # this one has dealt every job (its line in the log: each runs or waits for a place) or has ended
    [ "$l" = "${*: -1}" ] && continue
    while [ "$(dealt "$out/$name.log")" -le "$before" ] && kill -0 "${pids[-1]}" 2>/dev/null \
          && [ "$(date +%s)" -lt "$end" ]; do sleep 1; done
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done  # 1 where any job failed (not a refused or waiting one)
}
summaries() { tr '\r' '\n' < "$out/${1##*:}.log" 2>/dev/null | grep "^\[hydra\] [0-9]* jobs:"; }
for l in "${launches[@]}"; do : > "$out/${l##*:}.log"; done  # this allocation's logs
run_round "${launches[@]}"
again=()  # the launches whose last summary has waiting jobs: their grids have gone as far as this round took them
for l in "${launches[@]}"; do summaries "$l" | tail -1 | grep -q " waiting" && again+=("$l"); done
if [ ${#again[@]} -gt 0 ] && [ $(( end - $(date +%s) )) -gt 0 ]; then
  echo "$(date -u +%H:%M:%S) again, for their waiting jobs: ${again[*]%%:*}"
  run_round "${again[@]}"
fi
for l in "${launches[@]}"; do summaries "$l"; done
exit $rc
