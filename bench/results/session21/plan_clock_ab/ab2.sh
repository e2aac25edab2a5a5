#!/bin/bash
# OLD: a worktree of 97d2eca (git worktree add $OLD 97d2eca); NEW: this checkout (6f3ff0f for new1/new2,
# with the plan timed by thread_time for fix1/fix2); OUT: a scratch folder. T=0 bench, one repeat each, in the order listed.
cd "$(git rev-parse --show-toplevel)"
run() {
  PYTHONPATH=$2 .venv/bin/python -m specactor.cli bench --temperatures 0 --epochs 1 --repeats 1 --out $OUT/ab_$1 > $OUT/ab_$1.log 2>&1
  echo "$1" >> $OUT/ab2_summary.txt
  grep -h "^| specactor\|^| autoregressive" $OUT/ab_$1/suite.md | head -2 | cut -c1-60 >> $OUT/ab2_summary.txt
  .venv/bin/specactor events summarize $OUT/ab_$1/events-specactor-T0.jsonl 2>&1 | grep -E "^policy:" >> $OUT/ab2_summary.txt
}
rm -f $OUT/ab2_summary.txt
run fix1 $NEW
run old3 $OLD
run fix2 $NEW
echo done >> $OUT/ab2_summary.txt
