#!/bin/bash
# One T=1 long-tail rollout of a checkout, its processes' CPU time sampled every 0.5 s.
#   bash bench/results/session24/ab.sh TAG TREE MODE      (TREE: a checkout, e.g. from git worktree add)
# writes TAG.log, TAG.cpu.json, TAG.events.jsonl, TAG.out.jsonl in the current folder; then
#   python bench/results/session24/cpusplit.py TAG...   CPU seconds per process between the 2nd and last step
#   python bench/results/session24/stepstats.py TAG...  steps, forward seconds, chunks, median forward per batch range
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python}
tag=$1; tree=$2; mode=$3; shift 3
PYTHONPATH=$tree $python "$here/cpuwatch.py" "$tag" $python -m specactor.cli rollout --prompts humaneval:8 --n 4 \
  --temperature 1 --max-tokens 768 --seed 7 --mode "$mode" --no-progress --events "$tag.events.jsonl" \
  --out "$tag.out.jsonl" "$@" > /dev/null
grep "wall time" "$tag.log"
