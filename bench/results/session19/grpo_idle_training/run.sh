#!/bin/bash
# The GRPO example with the learned drafter: training while the verifier is idle (this change, "idle")
# against training at the weight update (the commit before it, "at_update"), interleaved.
#   bash bench/results/session19/grpo_idle_training/run.sh OLD_CHECKOUT
# OLD_CHECKOUT: a worktree of the commit before (git worktree add OLD e21f7d1) with this
# commit's examples/grpo_humaneval.py copied in (it has --drafters and the step/update split).
set -u
OLD=${1:?old checkout}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../../.." && pwd)
PY=$ROOT/.venv/bin/python
ARGS="--drafters ngram,suffix,learned --no-compare --epochs 2"
for i in 1 2; do
  for kind in idle at_update; do
    if [ "$kind" = idle ]; then dir=$ROOT; else dir=$OLD; fi
    (cd "$dir" && PYTHONPATH=$dir $PY examples/grpo_humaneval.py $ARGS) > "$HERE/${kind}_$i.txt" 2>&1
  done
done
