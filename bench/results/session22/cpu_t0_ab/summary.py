import json, sys, collections, glob, os
for d in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "[0-9]_*/"))):
    name = os.path.basename(d.rstrip('/'))
    if not os.path.exists(d + 'runs.jsonl') or not os.path.exists(d + 'events-specactor-T0.jsonl'):
        print(name, 'running'); continue
    runs = [json.loads(l) for l in open(d + 'runs.jsonl')]
    ms = {r['mode']: r['makespan_s'] for r in runs}
    if 'specactor' not in ms: print(name, 'running'); continue
    ev = [json.loads(l) for l in open(d + 'events-specactor-T0.jsonl')]
    vs = [e for e in ev if e['event'] == 'verify.step']
    dc = [e for e in ev if e['event'] == 'draft.chunk']
    per = collections.defaultdict(lambda: [0, 0])
    for e in vs:
        for m, c in (e.get('methods') or {}).items():
            per[m][0] += c[0]; per[m][1] += c[1]
    pa = [e for e in ev if e['event'] == 'policy.assign' and e['step'] == 7]
    step7 = 'on' if any(e['window'] > 0 for e in pa) else 'off'
    print(f"{name:8s} {ms['autoregressive'] / ms['specactor']:.2f}x steps {len(vs)} step7 {step7:3s} msgs/step {len(dc) / len(vs):.2f} "
          f"verified ngram {per['ngram'][1]}/{per['ngram'][0]} suffix {per['suffix'][1]}/{per['suffix'][0]} sent {sum(e['tokens'] for e in dc)}")
