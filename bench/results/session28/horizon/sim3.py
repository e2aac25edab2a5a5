from specactor.policy.bandit import FastestOfN
from specactor.policy.cost_model import CostModel
from specactor.policy.simulation import PlainPolicy, SimRequest, Simulator
def cpu():
    c = CostModel([1, 4, 8, 16, 32], [1, 2, 4, 8],
                  [[0.0185, 0.0199, 0.0214, 0.0248], [0.0223, 0.0251, 0.0301, 0.0491],
                   [0.0278, 0.0332, 0.0495, 0.0749], [0.0391, 0.0518, 0.0784, 0.1486],
                   [0.0639, 0.0888, 0.1417, 0.3195]])
    c.one_row_s = [[0.0185, 0.0199, 0.0214, 0.0248], [0.0223, 0.0253, 0.0275, 0.0292],
                   [0.0278, 0.0312, 0.0317, 0.0359], [0.0391, 0.0418, 0.0455, 0.0473],
                   [0.0639, 0.0662, 0.0724, 0.0719]]
    return c
import sys, os
HZ=[int(x) for x in os.environ.get("HZ","0,16").split(",")]
n=int(sys.argv[1]) if len(sys.argv)>1 else 32
def reqs(early, late, switch, limit=96):
    return [SimRequest(f"r{i}", limit, {"ngram": early}, switch_at=switch, acceptance_after={"ngram": late}, limit=limit) for i in range(n)]
for case in [(0.9,0.1,15),(0.85,0.1,15),(0.8,0.2,20),(0.8,0.8,None),(0.95,0.95,None)]:
    res={}
    for hz in HZ:
        out=[]
        for seed in range(4):
            run=lambda pol: Simulator(cpu(), seed=seed, plan_every=4, lag=2).run(reqs(*case), pol).makespan_s
            out.append(round(run(PlainPolicy())/run(FastestOfN(["ngram"], cpu(), max_window=8, seed=seed, closed_horizon=hz)),3))
        res[hz]=out
    print(case,res)
