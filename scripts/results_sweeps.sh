#!/usr/bin/env bash
# The results page's sweeps (docs/results/README.md) in one allocation of SECONDS (a Slurm job's time limit, a GPU
# lease): each task's grid and seeds launched side by side on the visible GPUs, which share each GPU's places
# (hydra.launcher.per_gpu, default 8), a job started only if it should end 90 s before the allocation does
# (hydra.launcher.finish_by, from the run lengths in launcher.jsonl and the record), each sweep going on from where
# its folders and its record (docs/results/<task>.json) left it. Run it again in the next allocation.
#   bash scripts/results_sweeps.sh SECONDS [TASK ...]     TASK: s2, retrieval, mqar (default: s2 retrieval)
# EXTRA: more Hydra overrides for every launch (e.g. hydra.launcher.per_gpu=12; a sweep key given there replaces the
# config's, so "hydra.launcher.per_gpu=8 backbone=path,path_fox" runs those backbones' jobs alone, at 8 a GPU, where
# their long runs fit in the allocation); SWEEPS_DIR: where the sweep folders
# go (default outputs/results, the configs' own), with each launch's log, SWEEPS_DIR/<task>-{grid,seeds}.log. (Not
# OUT, its first name: a job environment's own OUT, e.g. a lease's output folder, once sent the sweeps there.) A
# seeds job whose pair's grid has not finished waits (WAITING, best_lr's reason in the launch's summary: no process,
# no GPU place) and runs in a later allocation. Then:
#   python scripts/results.py collect <task> outputs/results/<task> --device ...   (the page's record)
set -uo pipefail
seconds=${1:?usage: results_sweeps.sh SECONDS [TASK ...]}
shift
tasks=("$@")
[ ${#tasks[@]} -eq 0 ] && tasks=(s2 retrieval)
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -gt 90 ]] || { echo "SECONDS=$seconds: the allocation's length, > 90" >&2; exit 2; }
end=$(( $(date +%s) + seconds - 90 ))
out=${SWEEPS_DIR:-outputs/results}
cd "$(dirname "$0")/.."
for t in "${tasks[@]}"; do
  [ -f "conf/sweep/results_${t}.yaml" ] || { echo "no task $t: choose from $(ls conf/sweep/results_*_seeds.yaml |
    sed 's|.*/results_||; s|_seeds.yaml||' | tr '\n' ' ')" >&2; exit 2; }
done
mkdir -p "$out"
pids=()
for t in "${tasks[@]}"; do
  for stage in "" _seeds; do
    left=$(( end - $(date +%s) ))
    [ "$left" -gt 0 ] || break 2
    log=$out/$t-$([ -n "$stage" ] && echo seeds || echo grid).log
    # OMP_NUM_THREADS=1: a GPU's 8 jobs of each launch would otherwise share the cores 8 x launches ways
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} ${PYTHON:-python} train.py -m "sweep=results_${t}${stage}" logger=none \
      "hydra.sweep.dir=$out/$t" \
      "hydra.launcher.finish_by=$left" ${EXTRA:-} > "$log" 2>&1 &
    pids+=($!)
    echo "$(date -u +%H:%M:%S) sweep=results_${t}${stage}: finish_by=${left}s, log $log"
    sleep 20  # the grid's jobs first in the GPUs' places; the seeds launch fills what is left
  done
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done  # 1 where any job failed (not a refused or waiting one): see its log
for t in "${tasks[@]}"; do
  for s in grid seeds; do
    [ -f "$out/$t-$s.log" ] && tr '\r' '\n' < "$out/$t-$s.log" | grep "^\[hydra\] [0-9]* jobs:"
  done
done
exit $rc
