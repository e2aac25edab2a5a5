#!/bin/bash
# session 27 device call C (carry .whl .dev/m1 .dev/s, a fresh machine): wheels installed, GGUF part a kept
export PYTHONUNBUFFERED=1
T0=$(date +%s)
LOG=$OUT/logC.txt
el() { echo "=== [$(( $(date +%s) - T0 )) s] $*" | tee -a $LOG; }
el "start $(nvidia-smi --query-gpu=name --format=csv,noheader)"
mkdir -p /tmp/sa && cp .dev/m1/parta /tmp/sa/parta && el "part a kept"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >> $LOG 2>&1
el done
