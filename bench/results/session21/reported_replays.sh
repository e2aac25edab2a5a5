#!/bin/bash
# The policy told each step's true time against a tenth of it (a GPU step timed by the host's
# clock: its launch), replayed on three rollouts and two GPU profiles:
#   bash bench/results/session21/reported_replays.sh
cd "$(git rev-parse --show-toplevel)"
R=bench/results; O=$R/session21/reported; mkdir -p $O
FILES="$R/session15/rollout_T0.jsonl $R/session15/rollout_heldout_T0.jsonl $R/session15/rollout_T1_seed8.jsonl"
for prof in $R/session17/gpu/profile_smollm2-135m_bfloat16.json $R/session17/gpu/profile_qwen2.5-7b_bfloat16.json; do
  name=$(basename $prof .json | sed 's/profile_//')
  for rep in 1.0 0.1 0.03; do
    .venv/bin/python bench/replay_policy.py $FILES --profile $prof --policies plain,geometric --seeds 3 \
      --reported $rep --out $O/${name}_reported_$rep.json > $O/${name}_reported_$rep.txt 2>&1
  done
done
touch $O/done
