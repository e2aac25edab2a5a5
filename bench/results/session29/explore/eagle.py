"""Experiment: EAGLE-style drafter (target's last hidden state + next token -> next hidden state) acceptance at T=1/T=0."""
import json, sys, time, copy
import torch, torch.nn.functional as F
from specactor.models import resolve_model
from specactor.verifier.weights import load_causal_lm
from specactor.verifier.config import rope_inv_freq
from specactor.verifier.model import apply_rope, rms_norm
from specactor.drafters.learned import build_student, frequent_vocab, RolloutBuffer, sample_in_vocab
from specactor.seeds import sample_seed

torch.manual_seed(0)
R = "bench/results/"
load = lambda p: [json.loads(l) for l in open(R + p)]
train_rows = load("vllm_suffix_s13/rollout_T1_torch_autoregressive_after_fix.jsonl")
evals = [("T1 next", load("session15/rollout_T1_seed8.jsonl"), 1.0, 8), ("T1 held", load("session15/rollout_heldout_T1.jsonl"), 1.0, 7),
         ("T0", load("session15/rollout_T0.jsonl"), 0.0, 7), ("T0 held", load("session15/rollout_heldout_T0.jsonl"), 0.0, 7)]
target = load_causal_lm(resolve_model(None))
epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 4
lr = float(sys.argv[2]) if len(sys.argv) > 2 else 1e-3
wfeat = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
buf = RolloutBuffer()
for r in train_rows: buf.add(list(r["prompt_ids"]), list(r["token_ids"]))
vocab = frequent_vocab(buf, 4096, always=target.cfg.eos_token_ids)
student = build_student(target, 1, vocab)
V = student.vocab
d = target.cfg.hidden_size
fc = torch.nn.Linear(2 * d, d, bias=False)
with torch.no_grad():
    fc.weight.zero_(); fc.weight[:, :d].copy_(torch.eye(d)); fc.weight[:, d:].copy_(torch.eye(d) * 0.0)

def run_layers(model, x, t):
    cfg = model.cfg
    positions = torch.arange(t)
    freqs = torch.outer(positions.float(), rope_inv_freq(cfg)); emb = torch.cat((freqs, freqs), -1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    hq, hkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    for layer in model.layers:
        h = rms_norm(x, layer.input_norm, layer.eps)
        qkv = layer.qkv(h)
        q = apply_rope(qkv[:, : hq * hd].view(t, hq, hd), cos, sin).transpose(0, 1)
        k = apply_rope(qkv[:, hq * hd: (hq + hkv) * hd].view(t, hkv, hd), cos, sin).transpose(0, 1)
        v = qkv[:, (hq + hkv) * hd:].view(t, hkv, hd).transpose(0, 1)
        a = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, enable_gqa=True)[0]
        x = x + layer.o(a.transpose(0, 1).reshape(t, hq * hd))
        h = rms_norm(x, layer.post_norm, layer.eps)
        g, u = layer.gate_up(h).chunk(2, -1)
        x = x + layer.down(F.silu(g) * u)
    return x

@torch.no_grad()
def features(ids):
    x = run_layers(target, target.embed(ids), ids.shape[0])
    return x  # pre-norm last hidden, [T, d]

def head(model, x):
    return model.lm_head(rms_norm(x, target.norm, target.cfg.rms_norm_eps))

def student_feats(ids, feats):
    # input t: [emb(ids[t+1]), feats[t]] -> predicts feats[t+1]
    inp = fc(torch.cat([student.embed(ids[1:]), feats[:-1]], -1))
    return run_layers(student, inp, inp.shape[0])

t0 = time.perf_counter()
data = []
for p, o in buf.samples:
    ids = torch.tensor(p + o)
    h = features(ids[:-1])  # h_t for t < T-1
    with torch.no_grad():
        probs = torch.softmax(target.lm_head(rms_norm(h, target.norm, target.cfg.rms_norm_eps)).float(), -1)[:, V]
    data.append((ids, h, probs, len(p)))
print("features s", time.perf_counter() - t0, flush=True)

student.requires_grad_(True); student.embed.weight.requires_grad_(False); student.norm.requires_grad_(False)
params = [q for q in student.parameters() if q.requires_grad] + list(fc.parameters())
opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)

CACHE = {}
@torch.no_grad()
def evaluate(tag):
    res = {}
    for name, rows, temp, seed in evals:
        hits1 = hits2 = tot = 0
        for r in rows:
            p, o = list(r["prompt_ids"]), list(r["token_ids"])
            ids = torch.tensor(p + o)
            key = (name, r["id"], r["sample"])
            if key not in CACHE: CACHE[key] = features(ids[:-1])
            h = CACHE[key]
            f1 = student_feats(ids[:-1], h)  # f1[t] ~ h[t+1], predicts ids[t+2]
            lg = head(student, f1)
            # output token o[j] = ids[len(p)+j]; predicted from f1[len(p)+j-2]
            js = list(range(1, len(o)))
            rows_ = torch.tensor([len(p) + j - 2 for j in js])
            s = sample_seed(seed, r["id"], r["sample"])
            pred = sample_in_vocab(lg[rows_], V, [temp] * len(js), [s] * len(js), js, target.cfg.vocab_size)
            ok1 = [a == o[j] for a, j in zip(pred, js)]
            # position 2: predicted feature feeds the next step (context approximated)
            inp2 = fc(torch.cat([student.embed(ids[1:-1]), torch.cat([h[:1], f1[:-1]])], -1))
            f2 = run_layers(student, inp2, inp2.shape[0])
            lg2 = head(student, f2)
            js2 = list(range(2, len(o)))
            rows2 = torch.tensor([len(p) + j - 2 for j in js2])
            pred2 = sample_in_vocab(lg2[rows2], V, [temp] * len(js2), [s] * len(js2), js2, target.cfg.vocab_size)
            ok2 = [ok1[j - 2] and a == o[j] for a, j in zip(pred2, js2)]
            hits1 += sum(ok1); hits2 += sum(ok2); tot += len(js)
        res[name] = (round(hits1 / tot, 4), round(hits2 / tot, 4))
    print(tag, res, flush=True)

g = torch.Generator().manual_seed(0)
t0 = time.perf_counter()
for e in range(epochs):
    tot = 0.0
    for i in torch.randperm(len(data), generator=g).tolist():
        ids, h, probs, plen = data[i]
        f1 = student_feats(ids[:-1], h)            # [T-2, d]: f1[t] ~ h[t+1]
        lg = head(student, f1)
        sl = slice(plen - 2, None)  # predicting output tokens
        logq = torch.log_softmax(lg[sl], -1)
        pt = probs[1:][sl]; pt = pt / pt.sum(-1, keepdim=True)
        soft = -(pt * logq).sum(-1).mean()
        feat = F.smooth_l1_loss(f1[sl], h[1:][sl])
        loss = soft + wfeat * feat
        opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
        tot += float(loss.detach())
    print("epoch", e, "loss", tot / len(data), "s", time.perf_counter() - t0, flush=True)
    evaluate(f"eagle after epoch {e+1}")
