#!/usr/bin/env bash
# Session 30's vLLM measurements after the whole-bench runs (vllm_all/), one after the other on the 2-core VM.
set -u
cd "$(dirname "$0")/../../.."
R=bench/results/session30
py=.venv/bin/python
# A. the perfect drafter's ceiling on vllm+keyed's own sample lengths (one keyed run at each temperature)
for t in 0 1; do
  $py bench/vllm_backend.py --temperature $t --modes vllm+keyed --out $R/ceilings/keyed_T$t.json > $R/ceilings/log_T$t.txt 2>&1
done
# B. the issue's exactness figure, 64 samples x 128 tokens at T=0, in float32 and in bfloat16
for d in float32 bfloat16; do
  $py bench/vllm_backend.py --prompts 16 --n 4 --max-tokens 128 --temperature 0 --dtype $d \
    --modes vllm,vllm+keyed,vllm+specactor --out $R/identity_64x128/$d.json > $R/identity_64x128/log_$d.txt 2>&1
done
# C. vLLM at window 16 against its suffix decoding at T=0
$py bench/vllm_backend.py --temperature 0 --window 16 --modes vllm+suffix,vllm+specactor --repeats 2 \
  --out $R/window16_t0/window16.json > $R/window16_t0/log.txt 2>&1
echo done > $R/measure.done
