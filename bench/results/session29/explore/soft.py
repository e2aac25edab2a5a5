"""Experiment: soft (teacher-distribution) distillation vs hard-sample distillation of the learned drafter."""
import json, sys, time, copy, math
import torch, torch.nn.functional as F
from specactor.models import resolve_model
from specactor.verifier.weights import load_causal_lm
from specactor.drafters.learned import LearnedDrafter, train_logits, frequent_vocab, set_head_vocab
from specactor.bench import replay_learned as rl

torch.manual_seed(0)
R = "bench/results/"
train_rows = [json.loads(l) for l in open(R + "vllm_suffix_s13/rollout_T1_torch_autoregressive_after_fix.jsonl")]
evals = [("T1 next", R + "session15/rollout_T1_seed8.jsonl", 1.0, 8), ("T1 held", R + "session15/rollout_heldout_T1.jsonl", 1.0, 7),
         ("T0", R + "session15/rollout_T0.jsonl", 0.0, 7), ("T0 held", R + "session15/rollout_heldout_T0.jsonl", 0.0, 7)]
evals = [(n, [json.loads(l) for l in open(p)], t, s) for n, p, t, s in evals]
target = load_causal_lm(resolve_model(None))
mode = sys.argv[1]  # hard | soft | mix
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
lr = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-3
topk = int(sys.argv[4]) if len(sys.argv) > 4 else 0

drafter = LearnedDrafter(target)
for r in train_rows:
    drafter.add_rollout(list(r["prompt_ids"]), list(r["token_ids"]))

def evaluate(tag):
    out = {}
    for name, rows, temp, seed in evals:
        pred = rl.teacher_forced_predictions(drafter, rows, temp, seed)
        out[name] = round(rl.hit_rate(pred, rows), 4)
    print(tag, out, flush=True)
    return out

if mode == "hard":
    t = time.perf_counter(); rep = drafter.train(); print("train", rep, time.perf_counter() - t, flush=True)
    evaluate("hard")
    sys.exit()

# soft: teacher distributions over the student vocab
vocab = frequent_vocab(drafter.buffer, drafter.vocab_limit, always=drafter.eos)
student = copy.deepcopy(drafter.student)
set_head_vocab(student, drafter._full_head, vocab)
V = student.vocab
t0 = time.perf_counter()
teach = []
with torch.no_grad():
    for p, o in drafter.buffer.samples:
        ids = torch.tensor(p + o[:-1])
        logits = train_logits(target, ids)[len(p) - 1:]
        logp = torch.log_softmax(logits.float(), -1)
        sub = logp[:, V]
        if topk:
            vals, idx = sub.topk(topk, -1)
            teach.append((vals.exp(), idx))
        else:
            teach.append(sub.exp())
print("teacher forward s", time.perf_counter() - t0, "mass in vocab", float(sub.exp().sum(-1).mean()), flush=True)
to_local = torch.full((student.cfg.vocab_size,), -100, dtype=torch.long); to_local[V] = torch.arange(len(V))
student.requires_grad_(True); student.embed.weight.requires_grad_(False)
params = [q for q in student.parameters() if q.requires_grad]
opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
g = torch.Generator().manual_seed(0)
samples = list(drafter.buffer.samples)
t0 = time.perf_counter()
for e in range(epochs):
    tot = 0.0
    for i in torch.randperm(len(samples), generator=g).tolist():
        p, o = samples[i]
        ids = torch.tensor(p + o)
        logits = train_logits(student, ids[:-1])[len(p) - 1:]
        logq = torch.log_softmax(logits, -1)
        if topk:
            probs, idx = teach[i]
            probs = probs / probs.sum(-1, keepdim=True)
            soft = -(probs * logq.gather(-1, idx)).sum(-1).mean()
        else:
            probs = teach[i]; probs = probs / probs.sum(-1, keepdim=True)
            soft = -(probs * logq).sum(-1).mean()
        loss = soft
        if mode == "mix":
            loss = 0.5 * soft + 0.5 * F.cross_entropy(logits, to_local[ids[len(p):]], ignore_index=-100)
        if mode == "tv":
            q = logq.exp()
            full = probs if not topk else torch.zeros_like(q).scatter(-1, idx, probs)
            loss = soft + 1.0 * (q - full).abs().sum(-1).mean()
        opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
        tot += float(loss)
    print("epoch", e, "loss", tot / len(samples), "s", time.perf_counter() - t0, flush=True)
    student.requires_grad_(False)
    drafter.student = student; drafter.reports.append(None)
    evaluate(f"{mode} k{topk} after epoch {e+1}")
    drafter.reports.clear()
    student.requires_grad_(True); student.embed.weight.requires_grad_(False)
