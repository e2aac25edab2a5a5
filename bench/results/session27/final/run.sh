#!/bin/bash
export PYTHON=/work/main/.venv/bin/python
AB=/work/main/bench/results/session24/ab.sh
for tag in t0_ar1 t0_sa1 t0_sa2 t0_ar2 t0_ar3 t0_sa3; do
  mode=autoregressive; [[ $tag == *sa* ]] && mode=specactor
  bash $AB $tag /tmp/wt_final $mode --temperature 0
done
for tag in t1_ar1 t1_sa1 t1_sa2 t1_ar2; do
  mode=autoregressive; [[ $tag == *sa* ]] && mode=specactor
  bash $AB $tag /tmp/wt_final $mode
done
echo ALLDONE
