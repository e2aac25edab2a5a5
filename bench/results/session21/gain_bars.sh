#!/bin/bash
# The drafting bar (min_gain) split by phase, replayed on five rollouts x five profiles, 5 seeds.
# Needs the experimental options tail_min_gain / batch_min_gain, which are not kept: apply
# bench/results/session21/gain_bars.patch first (git apply), then
#   bash bench/results/session21/gain_bars.sh
cd "$(git rev-parse --show-toplevel)"
S=bench/results/session18/sweep_profiles.sh
O=bench/results/session21/tail_gain
bash $S $O _base --policies plain,geometric --seeds 5
for g in 0.1 0.2; do bash $S $O _tail_$g --policies plain,geometric --seeds 5 --option tail_min_gain=$g; done
bash $S $O _min_0.1 --policies plain,geometric --seeds 5 --option min_gain=0.1
O=bench/results/session21/batch_gain
for g in 0.1 0.3 10; do bash $S $O _batch_$g --policies plain,geometric --seeds 5 --option batch_min_gain=$g; done
