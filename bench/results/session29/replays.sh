#!/bin/bash
# The learned drafter trained on 16 epochs' T=1 rollouts (no time cap), replayed beside ngram/suffix on
# this CPU's profile and the H200 7B profile; the same without it as the baseline. From the repository root:
#   bash bench/results/session29/replays.sh
set -e
R=bench/results; O=$R/session29/replays; mkdir -p $O
FILES="$R/session15/rollout_T1_seed8.jsonl $R/session15/rollout_heldout_T1.jsonl"
TRAIN=$R/vllm_suffix_s13/rollout_T1_torch_autoregressive_after_fix.jsonl
for s in $(seq 9 23); do TRAIN=$TRAIN,$R/session29/rollouts/T1_seed$s.jsonl.gz; done
for prof in $R/session29/profile_this_cpu.json $R/session17/gpu/profile_qwen2.5-7b_bfloat16.json; do
  name=$(basename $prof .json | sed 's/profile_//')
  python bench/replay_policy.py $FILES --profile $prof --policies plain,geometric,clairvoyant --seeds 3 \
    --out $O/base_$name.json > $O/base_$name.txt 2>&1
  python bench/replay_policy.py $FILES --profile $prof --learned $TRAIN --sampling 1:8,1:7 \
    --learned-option max_train_s=None --learned-option buffer_tokens=1000000000 \
    --policies plain,geometric,clairvoyant,perfect --seeds 3 --out $O/learned16_$name.json > $O/learned16_$name.txt 2>&1
done
echo done > $O/done
# added after the first pass: the same student drafting on the verifier's own GPU (its time adds to the step's)
prof=$R/session17/gpu/profile_qwen2.5-7b_bfloat16.json
python bench/replay_policy.py $FILES --profile $prof --learned $TRAIN --sampling 1:8,1:7 --learned-on-verifier \
  --learned-option max_train_s=None --learned-option buffer_tokens=1000000000 \
  --policies plain,geometric,clairvoyant --seeds 3 --out $O/learned16_onverifier_qwen2.5-7b_bfloat16.json \
  > $O/learned16_onverifier_qwen2.5-7b_bfloat16.txt 2>&1
