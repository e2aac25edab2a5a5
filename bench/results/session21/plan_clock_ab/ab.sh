#!/bin/bash
# OLD: a worktree of 97d2eca (git worktree add $OLD 97d2eca); NEW: this checkout (6f3ff0f for new1/new2,
# with the plan timed by thread_time for fix1/fix2); OUT: a scratch folder. T=0 bench, one repeat each, in the order listed.
# T=0 bench, old code (97d2eca) and new (HEAD), alternating: A B B A
cd "$(git rev-parse --show-toplevel)"
run() { # name, pythonpath
  PYTHONPATH=$2 .venv/bin/python -m specactor.cli bench --temperatures 0 --epochs 1 --repeats 1 --out $OUT/ab_$1 > $OUT/ab_$1.log 2>&1
  echo "$1 $(grep -h 'paired speedups' $OUT/ab_$1/suite.md | head -1)" >> $OUT/ab_summary.txt
  grep -h "^| specactor\|^| autoregressive" $OUT/ab_$1/suite.md | head -2 | cut -c1-60 >> $OUT/ab_summary.txt
}
rm -f $OUT/ab_summary.txt
run old1 $OLD
run new1 $NEW
run new2 $NEW
run old2 $OLD
echo done >> $OUT/ab_summary.txt
