#!/bin/bash
# The T=1 A/B of session 23: the code before (b985fa3) and after this session's policy changes, one
# rollout at a time, alternating old/new, four pairs. OLD and NEW are checkouts of the two versions
# (git worktree add), run from the repository's virtual environment.
for i in 1 2 3 4; do
  for v in old new; do
    tree=$([ $v = old ] && echo "$OLD" || echo "$NEW")
    (cd "$tree" && time PYTHONPATH="$tree" python -m specactor.cli rollout --prompts humaneval:8 --n 4 \
      --temperature 1 --max-tokens 768 --seed 7 --mode specactor --no-progress \
      --events ${v}_$i.events.jsonl --out ${v}_$i.out.jsonl) > ${v}_$i.log 2>&1
  done
done
