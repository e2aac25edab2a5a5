#!/bin/bash
# Replay the five rollouts on five cost profiles with the given replay_policy.py arguments:
#   bash bench/results/session18/sweep_profiles.sh OUT_DIR NAME_SUFFIX [replay_policy.py args...]
# min_gain/: for g in 0.03 0.1 0.2; do sweep_profiles.sh bench/results/session18/min_gain _min_gain_$g --policies plain,geometric --seeds 5 --option min_gain=$g; done
# split/ (needs split/split_model.patch applied): sweep_profiles.sh bench/results/session18/split "" --policies plain,geometric,split,clairvoyant --seeds 5
cd "$(git rev-parse --show-toplevel)"
R=bench/results; O=$1; SUFFIX=$2; shift 2
mkdir -p "$O"
FILES="$R/session15/rollout_T0.jsonl $R/session15/rollout_heldout_T0.jsonl $R/vllm_suffix_s13/rollout_T1_torch_autoregressive_after_fix.jsonl $R/session15/rollout_heldout_T1.jsonl $R/session15/rollout_T1_seed8.jsonl"
for prof in packaged $R/session14/vllm_profile.json $R/session17/gpu/profile_qwen2.5-7b_bfloat16.json $R/session17/gpu/profile_qwen2.5-32b_bfloat16.json $R/session17/gpu/profile_smollm2-135m_bfloat16.json; do
  name=$(basename $prof .json | sed 's/profile_//'); P=""; [ $prof != packaged ] && P="--profile $prof"
  .venv/bin/python bench/replay_policy.py $FILES $P "$@" --out $O/$name$SUFFIX.json > $O/$name$SUFFIX.txt 2>&1
done
