#!/usr/bin/env bash
# The GPU runs behind the README's synthetic-task tables (issue #7), as Hydra multiruns (one process per sweep, so
# FLA's autotuning happens once):
#   bash scripts/synthetic_gpu.sh OUT parity    # 1-layer GLA (and Transformer) x {nope, rope, selective_rope}, S2
#   bash scripts/synthetic_gpu.sh OUT mqar      # 2-layer GLA x {nope, rope, selective_rope}, MQAR (128, 8)
# STEPS (default 3000) sets the budget; every run writes task_eval.json + accuracy_vs_length.png, and each sweep
# ends with scripts/collect_sweep.py's table and figure in OUT/<sweep>.
set -euo pipefail
OUT=${1:?usage: synthetic_gpu.sh OUT parity|mqar|copying}
WHAT=${2:?usage: synthetic_gpu.sh OUT parity|mqar|copying}
STEPS=${STEPS:-3000}
# on exit (also a timeout): drop checkpoints and pack OUT into OUT/<what>.tar.gz (one file travels back easily)
pack() { find "$OUT" -name checkpoints -type d -prune -exec rm -rf {} +;
         tar -czf "/tmp/$WHAT.tar.gz" -C "$OUT" . && rm -rf "${OUT:?}"/* && mv "/tmp/$WHAT.tar.gz" "$OUT/"; }
trap pack EXIT
common=(logger.mode=disabled train.progress=false train.steps=$STEPS train.epochs=null train.eval_interval=$STEPS
        train.ckpt_interval=1000000)
case $WHAT in
  parity)
    python train.py -m sweep=parity backbone=gla pe=nope,rope,selective_rope optim.lr=${LRS:-1e-3,3e-3} \
      hydra.sweep.dir=$OUT/parity_gla "${common[@]}"
    python train.py -m sweep=parity backbone=transformer pe=nope,rope,selective_rope optim.lr=1e-3 \
      hydra.sweep.dir=$OUT/parity_transformer "${common[@]}"
    python scripts/collect_sweep.py $OUT/parity_gla $OUT/parity_transformer --out $OUT/parity ;;
  mqar)
    python train.py -m task=mqar backbone=gla pe=nope,rope,selective_rope optim.lr=${LRS:-1e-3,3e-3} data.seq_len=128 \
      data.num_kv_pairs=8 hydra.sweep.dir=$OUT/mqar_gla "${common[@]}"
    python scripts/collect_sweep.py $OUT/mqar_gla ;;
  copying)
    python train.py -m sweep=copying_gla optim.lr=1e-3 hydra.sweep.dir=$OUT/copying_gla "${common[@]}"
    python scripts/collect_sweep.py $OUT/copying_gla ;;
  *) echo "unknown: $WHAT (parity | mqar | copying)"; exit 2 ;;
esac
