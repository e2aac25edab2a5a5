#!/bin/bash
# The policy replayed on session 15's five rollouts and six cost profiles, 5 seeds, two at a time
# (as session 23's replay_final): bash bench/results/session24/replay.sh OUT_FOLDER
set -e
out=${1:?usage: replay.sh OUT_FOLDER}
mkdir -p "$out"
rollouts="bench/results/session15/rollout_T0.jsonl bench/results/session15/rollout_heldout_T0.jsonl bench/results/vllm_suffix_s13/rollout_T1_torch_autoregressive_after_fix.jsonl bench/results/session15/rollout_heldout_T1.jsonl bench/results/session15/rollout_T1_seed8.jsonl"
run() {  # NAME [--profile PATH]
  name=$1; shift
  python bench/replay_policy.py $rollouts "$@" --policies plain,geometric --seeds 5 --out "$out/$name.json" > "$out/$name.txt" 2>&1
}
run packaged &
run smollm2-135m-float32-cpu-t2-1a83fe2c4f72fbe9 --profile bench/results/session23/profile_this_cpu.json
wait
run vllm_profile --profile bench/results/session14/vllm_profile.json &
run qwen2.5-7b_bfloat16 --profile bench/results/session17/gpu/profile_qwen2.5-7b_bfloat16.json
wait
run qwen2.5-32b_bfloat16 --profile bench/results/session17/gpu/profile_qwen2.5-32b_bfloat16.json &
run qwen2.5-7b_bfloat16_graphs --profile bench/results/session22/gpu/profile_qwen2.5-7b_bfloat16_graphs.json
wait
