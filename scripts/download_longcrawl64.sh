#!/usr/bin/env bash
# Download LongCrawl64 (Buckman 2024; ~800 GB: train.zarr with 6,609,334 documents and heldout.zarr with 52,131,
# each a [documents, 65536] array of GPT-2 tokens) into DIR, the folder that data.root names:
#   bash scripts/download_longcrawl64.sh /data/longcrawl64 [--flat]
#   python train.py data=longcrawl64 data.root=/data/longcrawl64 model.seq_len=16384 ...
# Source: the original bucket gs://longcrawl64 (named by Manifest AI's article and the FoX code); other projects
# reported it gone in 2026, so when gsutil fails this falls back to the Hugging Face mirror clankur/longcrawl64
# (check that what lands in DIR is train.zarr + heldout.zarr; not verified here, this machine has no network).
# --flat also writes train.bin / heldout.bin (flat uint16, document after document), which need no zarr to read.
set -euo pipefail
dir=${1:?usage: download_longcrawl64.sh DIR [--flat]}
mkdir -p "$dir"
if command -v gsutil >/dev/null && GSUTIL_PARALLEL_THREAD_COUNT=5 GSUTIL_PARALLEL_PROCESS_COUNT=5 \
    gsutil -m cp -r 'gs://longcrawl64/*.zarr' "$dir"; then
  echo "downloaded from gs://longcrawl64"
else
  echo "gs://longcrawl64 unavailable (or no gsutil); trying the Hugging Face mirror clankur/longcrawl64" >&2
  huggingface-cli download clankur/longcrawl64 --repo-type dataset --local-dir "$dir"
fi
ls "$dir"
if [[ ${2:-} == --flat ]]; then
  python -m duality.data.longcrawl64 flatten "$dir"
fi
