#!/usr/bin/env bash
# Session 30, after bench/vllm_backend.py's ceilings were fixed to the specactor mode's own window (8 on
# vLLM): the ceilings again on vllm+keyed's tokens, then window 8 against window 16 for vLLM + specactor.
set -u
cd "$(dirname "$0")/../../.."
R=bench/results/session30
py=.venv/bin/python
for t in 0 1; do
  $py bench/vllm_backend.py --temperature $t --modes vllm+keyed --out $R/ceilings_w8/keyed_T$t.json > $R/ceilings_w8/log_T$t.txt 2>&1
done
for d in float32 bfloat16; do
  $py bench/vllm_backend.py --prompts 16 --n 4 --max-tokens 128 --temperature 0 --dtype $d --modes vllm+keyed \
    --out $R/ceilings_w8/keyed_64x128_$d.json > $R/ceilings_w8/log_64x128_$d.txt 2>&1
done
bash $R/window_ab.sh T0 1 3 --temperature 0
bash $R/window_ab.sh T1 1 3 --temperature 1
bash $R/window_ab.sh b64 1 3 --prompts 16 --n 4 --max-tokens 128 --temperature 0
