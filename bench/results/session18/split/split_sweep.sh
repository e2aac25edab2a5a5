#!/bin/bash
# The split acceptance model (first token, continuation) against geometric, five rollouts, five profiles.
cd "$(git rev-parse --show-toplevel)"
R=bench/results; O=$R/session18/split
mkdir -p $O
FILES="$R/session15/rollout_T0.jsonl $R/session15/rollout_heldout_T0.jsonl $R/vllm_suffix_s13/rollout_T1_torch_autoregressive_after_fix.jsonl $R/session15/rollout_heldout_T1.jsonl $R/session15/rollout_T1_seed8.jsonl"
for prof in packaged $R/session14/vllm_profile.json $R/session17/gpu/profile_qwen2.5-7b_bfloat16.json $R/session17/gpu/profile_qwen2.5-32b_bfloat16.json $R/session17/gpu/profile_smollm2-135m_bfloat16.json; do
  name=$(basename $prof .json | sed 's/profile_//'); P=""; [ $prof != packaged ] && P="--profile $prof"
  .venv/bin/python bench/replay_policy.py $FILES $P --policies plain,geometric,split,clairvoyant --seeds 5 --out $O/$name.json > $O/$name.txt 2>&1
done
echo done > $O/sweep.done
