#!/bin/bash
# The half-rows figure against the straight line, on the same cached v3 profile, as session 28 ran it:
#   TREE_half=<a copy of 34b4d1b's tree> TREE_nohalf=<the same with `model.half_rows_s = None` forced in
#   CostModel.from_profile> bash bench/results/session28/ab_half.sh OUT
# the sweep (batch 8, 32; T=0, 0.7, 1; 96 tokens; 3 repeats), then the long-tail bench at T=0 and T=1,
# the trees alternating.
out=${1:?usage: ab_half.sh OUT}
mkdir -p "$out"
py=${PYTHON:-python}
for t in half nohalf; do
  tree_var=TREE_$t; tree=${!tree_var}
  (cd "$tree" && PYTHONPATH="$tree" $py bench/speculation.py --drafters ngram,suffix --batches 8,32 --temperatures 0,0.7,1 \
     --tokens 96 --repeats 3 --only specactor --out "$out/sw_$t.json" > "$out/sw_$t.log" 2>&1)
done
for temp in 0 1; do for t in nohalf half; do
  tree_var=TREE_$t; tree=${!tree_var}
  (cd "$tree" && PYTHONPATH="$tree" $py -m specactor.cli bench --temperatures $temp --epochs 1 --repeats 3 \
     --modes autoregressive,specactor --out "$out/bench_${t}_t$temp" > "$out/bench_${t}_t$temp.log" 2>&1)
done; done
