#!/bin/bash
# session 22+ device call 1 (with .dev/m1, .dev/s, .whl carried): wheels + GGUF part a kept; the CUDA
# tests (step clock included), losslessness on the GPU, step overhead with graphs (forward_ms now device time)
export PYTHONUNBUFFERED=1
T0=$(date +%s)
LOG=$OUT/log1.txt
el() { echo "=== [$(( $(date +%s) - T0 )) s] $*" | tee -a $LOG; }
el start
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> $LOG 2>&1
mkdir -p /tmp/sa && cp .dev/m1/parta /tmp/sa/parta && el "part a kept"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >> $LOG 2>&1
export PYTHONPATH=/tmp/site:$PWD
el "cuda tests (tiny random models), the step clock's"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/verifier/test_cuda.py tests/verifier/test_step_clock.py -k "not rollout" >> $LOG 2>&1
SPECACTOR_TEST_DEVICE=cuda timeout 60 python3 -m pytest -q -p no:cacheprovider tests/verifier/test_lossless.py >> $LOG 2>&1
el "step overhead bfloat16 batch 32, graphs on and off"
timeout 45 python3 bench/step_overhead.py --device cuda --dtype bfloat16 --batch 32 --steps 20 --graphs on,off > $OUT/step_bfloat16_b32.json 2>>$LOG
for shape in qwen2.5-7b smollm2-135m; do
  el "cost profile $shape bf16 graphs"
  timeout 90 python3 bench/cost_profile.py --shape "$shape" --dtype bfloat16 --device cuda --context 512 \
    --batch-sizes 1,2,4,8,16,32,64 --chunk-lens 1,2,4,8,9,16,17 --repeats 5 --cuda-graphs \
    --out $OUT/profile_${shape}_bfloat16_graphs.json >> $LOG 2>&1
done
el done
