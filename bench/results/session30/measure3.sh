#!/usr/bin/env bash
# Session 30: three more window pairs on vLLM (pairs 4-6), T=0 long tail and batch 64, as measure2.sh's.
set -u
R="$(dirname "$0")"
bash $R/window_ab.sh T0 4 6 --temperature 0
bash $R/window_ab.sh b64 4 6 --prompts 16 --n 4 --max-tokens 128 --temperature 0
