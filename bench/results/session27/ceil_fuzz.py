"""Fuzz of bench.ceilings.uniform_drafter's claim that a better hypothetical drafter never does worse (1% slack):
1,500 random cases (lengths from argv[1] to 300); prints the failures. Run from the repository root."""
import sys, random
sys.path.insert(0, "tests/bench"); sys.path.insert(0, "tests")
from test_ceilings import cost_model
from specactor.bench.ceilings import uniform_drafter
from specactor.policy.cost_model import DraftCost
cost = cost_model()
rng = random.Random(0)
fails = []
for n in range(1500):
    k = rng.randint(1, 12)
    lo = int(sys.argv[1])
    lengths = [rng.randint(lo, 300) for _ in range(k)]
    p = rng.random(); more = rng.random() * 0.5; d = rng.choice([0.0, 1e-3, 1e-2])
    draft = DraftCost(per_row_s=d, fixed_s=d / 2)
    s = uniform_drafter(lengths, cost, p, draft, max_window=16)[0]
    s2 = uniform_drafter(lengths, cost, min(1.0, p + more), draft, max_window=16)[0]
    if s2 < s * 0.99:
        fails.append((min(lengths), round(p, 3), round(min(1, p + more), 3), d, round(s, 3), round(s2, 3)))
print(len(fails), fails[:8])
