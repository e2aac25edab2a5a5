#!/bin/bash
# session 27 device call A (carry .whl .dev/m1 .dev/s): wheels installed, GGUF part a kept; the CUDA tests and
# the losslessness properties on the GPU at this commit
export PYTHONUNBUFFERED=1
T0=$(date +%s)
LOG=$OUT/logA.txt
el() { echo "=== [$(( $(date +%s) - T0 )) s] $*" | tee -a $LOG; }
el "start $(git rev-parse --short HEAD 2>/dev/null)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> $LOG 2>&1
mkdir -p /tmp/sa && cp .dev/m1/parta /tmp/sa/parta && el "part a kept"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >> $LOG 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import torch, transformers, sys; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.get_device_name())" >> $LOG 2>&1
el "cuda tests (tiny random models)"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/verifier/test_cuda.py tests/verifier/test_step_clock.py -k "not rollout" >> $LOG 2>&1
el "losslessness properties on the GPU"
SPECACTOR_TEST_DEVICE=cuda timeout 80 python3 -m pytest -q -p no:cacheprovider tests/verifier/test_lossless.py >> $LOG 2>&1
el done
