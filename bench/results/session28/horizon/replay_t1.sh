#!/bin/bash
# T>0 rollouts (session 15's three long-tail T=1 ones, and two 96-token batch-32 ones from this session) replayed
# on six cost profiles, 5 seeds: bash replay_t1.sh OUT_FOLDER [--option closed_horizon=N]
set -e
out=${1:?usage}; shift
mkdir -p "$out"
r=bench/results
rollouts="$r/vllm_suffix_s13/rollout_T1_torch_autoregressive_after_fix.jsonl $r/session15/rollout_heldout_T1.jsonl $r/session15/rollout_T1_seed8.jsonl $r/session28/horizon/short_t1.jsonl $r/session28/horizon/short_t07.jsonl"
run() { name=$1; shift; python bench/replay_policy.py $rollouts "$@" --policies plain,geometric --seeds 5 --out "$out/$name.json" > "$out/$name.txt" 2>&1; }
run packaged "$@" &
run this_cpu --profile $r/session23/profile_this_cpu.json "$@"
wait
run vllm_profile --profile $r/session14/vllm_profile.json "$@" &
run qwen7b --profile $r/session17/gpu/profile_qwen2.5-7b_bfloat16.json "$@"
wait
run qwen32b --profile $r/session17/gpu/profile_qwen2.5-32b_bfloat16.json "$@" &
run qwen7b_graphs --profile $r/session22/gpu/profile_qwen2.5-7b_bfloat16_graphs.json "$@"
wait
