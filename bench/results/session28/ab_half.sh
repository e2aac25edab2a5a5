#!/bin/bash
# the half-rows column against the straight line, same v3 profile: sweep (batch 8, 32; T=0, 0.7, 1; 96 tokens),
# then the long-tail bench at T=0 and T=1, trees alternating
cd /tmp/s28
PY=/work/main/.venv/bin/python
for t in half nohalf; do
  (cd /tmp/wt_$t && PYTHONPATH=/tmp/wt_$t $PY bench/speculation.py --drafters ngram,suffix --batches 8,32 --temperatures 0,0.7,1 --tokens 96 --repeats 3 --only specactor --out /tmp/s28/sw_$t.json > /tmp/s28/sw_$t.log 2>&1)
done
for temp in 0 1; do for t in nohalf half; do
  (cd /tmp/wt_$t && PYTHONPATH=/tmp/wt_$t $PY -m specactor.cli bench --temperatures $temp --epochs 1 --repeats 3 --modes autoregressive,specactor --out /tmp/s28/bench_${t}_t$temp > /tmp/s28/bench_${t}_t$temp.log 2>&1)
done; done
