#!/bin/bash
# The learned drafter replayed beside ngram/suffix on CPU and H200 profiles.
cd "$(git rev-parse --show-toplevel)"
R=bench/results; O=$R/session18
FILES="$R/session15/rollout_T1_seed8.jsonl $R/session15/rollout_heldout_T1.jsonl $R/session15/rollout_T0.jsonl $R/session15/rollout_heldout_T0.jsonl"
SAMP=1:8,1:7,0:7,0:7
TRAIN=$R/vllm_suffix_s13/rollout_T1_torch_autoregressive_after_fix.jsonl
for prof in packaged $R/session17/gpu/profile_qwen2.5-7b_bfloat16.json $R/session17/gpu/profile_qwen2.5-32b_bfloat16.json $R/session17/gpu/profile_smollm2-135m_bfloat16.json; do
  name=$(basename $prof .json | sed 's/profile_//'); P=""; [ $prof != packaged ] && P="--profile $prof"
  .venv/bin/python bench/replay_policy.py $FILES $P --policies plain,geometric,clairvoyant --seeds 3 --out $O/replay_base_$name.json > $O/replay_base_$name.txt 2>&1
  .venv/bin/python bench/replay_policy.py $FILES $P --learned $TRAIN --sampling $SAMP --policies plain,geometric,clairvoyant,perfect --seeds 3 --out $O/replay_learned_$name.json > $O/replay_learned_$name.txt 2>&1
  .venv/bin/python bench/replay_policy.py $FILES $P --learned $TRAIN --sampling $SAMP --learned-on-verifier --policies plain,geometric,clairvoyant --seeds 3 --out $O/replay_learned_onverifier_$name.json > $O/replay_learned_onverifier_$name.txt 2>&1
done
echo done > $O/replays.done
