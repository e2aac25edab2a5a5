#!/usr/bin/env bash
# Window 8 (vLLM's default) against 16 for vLLM + specactor, pairs FIRST..LAST, alternating which goes
# first (odd pairs 8 then 16):  bash window_ab.sh NAME FIRST LAST [bench/vllm_backend.py workload flags]
set -u
cd "$(dirname "$0")/../../.."
R=bench/results/session30
name=$1 first=$2 last=$3
shift 3
for pair in $(seq "$first" "$last"); do
  if (( pair % 2 )); then order="8 16"; else order="16 8"; fi
  for w in $order; do
    .venv/bin/python bench/vllm_backend.py "$@" --modes vllm+specactor --window $w \
      --out $R/window_ab/${name}_w${w}_pair$pair.json > $R/window_ab/${name}_w${w}_pair$pair.log 2>&1
  done
done
