#!/bin/bash
# session 22 device call 1 (carry .dev/m1 .dev/s .whl): part a kept, wheels installed; the CUDA tests (warm-up path)
export PYTHONUNBUFFERED=1
T0=$(date +%s)
LOG=$OUT/log1.txt
el() { echo "=== [$(( $(date +%s) - T0 )) s] $*" | tee -a $LOG; }
el start
mkdir -p /tmp/sa && cp .dev/m1/parta /tmp/sa/parta && el "part a kept"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >> $LOG 2>&1
export PYTHONPATH=/tmp/site:$PWD
timeout 40 python3 -m pytest -q -p no:cacheprovider tests/verifier/test_engine.py -k warm_up tests/test_coordinator.py::test_a_call_s_samples_reach_the_verifier_in_one_message >> $LOG 2>&1
el done
