#!/bin/bash
# The GPU checks in one go, each stage under its own time limit, everything written to OUTDIR:
#
#     bash bench/gpu_check.sh OUTDIR [STAGES]
#
# STAGES (comma-separated, default all of them in this order):
#   tests     the CUDA tests and the losslessness properties on the GPU (tiny random models)
#   rollout   the end-to-end CUDA test (needs the default model installed)
#   step      where an engine step's time goes (bench/step_overhead.py), bf16 and fp32, CUDA graphs on and off
#   profiles  cost profiles of real shapes with random weights (135M, 7B, 32B; bf16), eager and CUDA graphs
#   bench     the long-tail bench, bf16, autoregressive vs specactor, graphs and eager (needs the default model)
#   identity  token identity by batch size and mode, fp32 and bf16 (needs the default model)
#   copy      the model drafter's torch copies on the GPU: its CUDA test, and what bf16 / int8w / int4w
#             proposals cost by batch size, CUDA graphs replayed (needs the default model)
#
# The first time this ran (an H200, bench/RESULTS.md "specactor on a GPU"), tests + profiles took
# 160 s, rollout + bench + identity 440 s, step 50 s. Set PYTHON to the interpreter that has torch.
set -u
OUT=${1:?usage: bash bench/gpu_check.sh OUTDIR [STAGES]}
STAGES=",${2:-tests,rollout,step,profiles,bench,identity,copy},"
PY=${PYTHON:-python3}
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
T0=$(date +%s)
export PYTHONUNBUFFERED=1
stage() { echo "=== [$(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }
want() { [[ "$STAGES" == *",$1,"* ]]; }

stage "start: $($PY -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())' 2>&1)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$LOG" 2>&1
if want tests; then
  stage "CUDA tests"
  timeout 120 $PY -m pytest -q -p no:cacheprovider tests/verifier/test_cuda.py tests/engine/test_step_clock.py \
    -k "not rollout" >> "$LOG" 2>&1
  stage "losslessness properties on the GPU"
  SPECACTOR_TEST_DEVICE=cuda timeout 150 $PY -m pytest -q -p no:cacheprovider tests/verifier/test_lossless.py \
    >> "$LOG" 2>&1
fi
if want rollout; then
  stage "end-to-end rollout on the GPU"
  timeout 120 $PY -m pytest -q -p no:cacheprovider tests/verifier/test_cuda.py -k rollout >> "$LOG" 2>&1
fi
if want step; then
  for spec in "bfloat16 32" "bfloat16 4" "float32 32"; do
    set -- $spec
    stage "step overhead $1 batch $2"
    timeout 90 $PY bench/step_overhead.py --device cuda --dtype "$1" --batch "$2" --steps 20 --graphs on,off \
      > "$OUT/step_$1_b$2.json" 2>> "$LOG"
  done
fi
if want profiles; then
  for shape in qwen2.5-7b smollm2-135m qwen2.5-32b; do
    stage "cost profile $shape bf16"
    for graphs in "" "--cuda-graphs"; do
      timeout 90 $PY bench/cost_profile.py --shape "$shape" --dtype bfloat16 --device cuda --context 512 \
        --batch-sizes 1,2,4,8,16,32,64 --chunk-lens 1,2,4,8,9,16,17 --repeats 5 $graphs \
        --out "$OUT/profile_${shape}_bfloat16${graphs:+_graphs}.json" >> "$LOG" 2>&1
    done
  done
fi
if want bench; then
  stage "long-tail bench, bf16"
  timeout 420 $PY -m specactor bench --device cuda --dtype bfloat16 --temperatures 1,0 --epochs 1 \
    --repeats 2 --out "$OUT/suite" >> "$LOG" 2>&1
  stage "long-tail bench, bf16, eager (no CUDA graphs)"
  timeout 300 $PY -m specactor bench --device cuda --dtype bfloat16 --temperatures 1,0 --epochs 1 \
    --repeats 1 --eager --out "$OUT/suite_eager" >> "$LOG" 2>&1
  # the cost profiles the policy decided on (measured live, cached): what replays of these runs need
  cp -r "$($PY -c "from specactor.engine.model_registry import cache_dir; print(cache_dir())")/profiles" "$OUT/live_profiles" 2>> "$LOG"
fi
if want identity; then
  for dtype in float32 bfloat16; do
    stage "token identity $dtype"
    timeout 120 $PY bench/batch_invariance.py --device cuda --dtype "$dtype" --prompts 16 --n 4 --tokens 256 \
      --batches 32,8 --out "$OUT/identity_$dtype.json" >> "$LOG" 2>&1
  done
fi
if want copy; then
  stage "the model copy on the GPU"
  timeout 120 $PY -m pytest -q -p no:cacheprovider tests/drafters/test_model_drafter.py -k cuda >> "$LOG" 2>&1
  timeout 240 $PY bench/draft_cost.py --device cuda --quants bf16,int8w,int4w --threads 1 \
    --out "$OUT/draft_cost_cuda.json" >> "$LOG" 2>&1
fi
stage done
