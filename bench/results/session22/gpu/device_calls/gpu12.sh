#!/bin/bash
# session 22 device call 1 (carry .dev/m1 .dev/s .whl .dev/tinyck): part a kept; a tiny random model with the
# default vocabulary at T=1 (drafts never accepted): specactor against autoregressive is pure overhead
export PYTHONUNBUFFERED=1
T0=$(date +%s)
LOG=$OUT/log1.txt
el() { echo "=== [$(( $(date +%s) - T0 )) s] $*" | tee -a $LOG; }
el start
mkdir -p /tmp/sa && cp .dev/m1/parta /tmp/sa/parta && el "part a kept"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >> $LOG 2>&1
export PYTHONPATH=/tmp/site:$PWD SPECACTOR_CACHE=/tmp/sacache
el "tiny model bench T=1, 256 tokens, repeats 3"
timeout 150 python3 -m specactor.cli bench --model $PWD/.dev/tinyck --device cuda --dtype bfloat16 --temperatures 1 --epochs 1 \
  --max-tokens 256 --repeats 3 --out $OUT/tiny >> $LOG 2>&1
el done
