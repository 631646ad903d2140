#!/usr/bin/env bash
# The GPU measurements of the memory issue (#23), in parts that each fit one sitting; every part writes under OUT:
#   bash benchmarks/memory_gpu.sh OUT saved     # what each model keeps for backward, by module (saved_activations.py):
#                                            # this repo's GLA, FoX, transformer vs FLA's GLA, FoX and nanoGPT's
#   bash benchmarks/memory_gpu.sh OUT ac        # 370m/4096 compiled, activation checkpointing none | full | selective
#   bash benchmarks/memory_gpu.sh OUT fla       # this repo (compiled and eager) vs FLA's own models (eager), 370m/4096,
#                                            # and their table (OUT/vs_fla.md: speed and memory ratios, the goals)
#   bash benchmarks/memory_gpu.sh OUT longest   # one step of 65,536 tokens at contexts 65,536 and 16,384, full
#                                            # checkpointing and the chunked loss, compiled, each main backbone
#   bash benchmarks/memory_gpu.sh OUT profile   # where the time goes against FLA (the speed goal): this repo compiled
#                                            # and FLA's model eager, each case's top kernels by GPU time
# CASES overrides a part's cases (FLA_CASES the FLA models of profile); bench_train.py's --resume keeps the rows of
# a part cut short (run it again).
set -uo pipefail
OUT=${1:?usage: memory_gpu.sh OUT saved|ac|fla|longest|profile}
WHAT=${2:?usage: memory_gpu.sh OUT saved|ac|fla|longest|profile}
mkdir -p "$OUT"
bench=(python benchmarks/bench_train.py --out "$OUT" --resume --steps 5 --warmup 2)
case $WHAT in
  saved)
    python benchmarks/saved_activations.py --setting 370m:4096 --out "$OUT/saved_370m_4096.json" \
      --cases ${CASES:-gla+nope fla:gla fox+nope fla:forgetting_transformer transformer+rope ref} ;;
  ac)
    for ac in none full selective; do
      "${bench[@]}" --settings 370m:4096 --compile on --cases ${CASES:-transformer+rope gla+nope} \
        --set train.activation_checkpointing=$ac --tag _ac_$ac
    done ;;
  fla)
    "${bench[@]}" --settings 370m:4096 --compile off --tag _fla_peers \
      --cases ${CASES:-fla:gla fla:gated_deltanet fla:forgetting_transformer fla:delta_net fla:retnet fla:linear_attn fla:path_attn}
    "${bench[@]}" --settings 370m:4096 --compile both --tag _fla_ours \
      --cases ${CASES:-gla+nope gated_deltanet+nope fox+nope deltanet+nope retnet+nope linear_attn+nope path+nope}
    python benchmarks/bench_train.py --vs-fla "$OUT"/bench_train_fla_{peers,ours}.json | tee "$OUT/vs_fla.md" ;;
  longest)
    python benchmarks/bench_train.py --out "$OUT" --resume --steps 3 --warmup 1 --settings 370m:65536 370m:16384 \
      --tokens 65536 --compile on --tag _longest \
      --set train.activation_checkpointing=full model.fused_loss=true \
      --cases ${CASES:-transformer+rope fox+nope gla+nope gated_deltanet+nope sympow+rope} ;;
  profile)
    "${bench[@]}" --settings 370m:4096 --compile off --tag _profile_fla --profile \
      --cases ${FLA_CASES:-fla:gla fla:retnet}
    "${bench[@]}" --settings 370m:4096 --compile on --tag _profile_ours --profile \
      --cases ${CASES:-gla+nope retnet+nope} ;;
  *) echo "unknown part $WHAT: saved | ac | fla | longest | profile" >&2; exit 2 ;;
esac
