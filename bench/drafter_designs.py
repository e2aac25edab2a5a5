"""Which learned drafter design: token-only students (hard or soft labels, 2 or 4 layers) against an
EAGLE-style head that reads the target's hidden states, on the same rollouts, at T=1 and T=0.

    python bench/drafter_designs.py [--max-tokens 192] [--epochs 3] [--out bench/results/drafter_designs.json]

Data: the target (autoregressive) rolls out 8 HumanEval prompts x 4 samples at T=1 for ``--epochs``
seeds (what ``--epochs`` RL epochs give a drafter to learn from) and 4 held-out prompts x 2 at T=1
and T=0. Every design trains on the same training rollouts and is measured teacher-forced on the
held-out ones (``bench/learned_drafter.py``'s rule: 4-token proposals at every 8th position with the
target's position-keyed noise; position j counts when the first j tokens are all right).

Designs:
- ``student-L-hard``: the shipped :class:`~specactor.drafters.learned.LearnedDrafter` (L layers,
  next-token cross-entropy on the sampled tokens).
- ``student-L-soft``: the same network trained against the target's whole distribution
  (teacher-forced logits over the drafter's vocabulary; the target's forward is timed as its cost).
- ``eagle``: EAGLE-1's shape: (target feature f_t, embedding of token t+1) -> a linear fuse -> one
  decoder layer (initialised from the target's last) -> predicted f_{t+1} -> the target's norm and
  head rows; loss = feature regression + soft cross-entropy; drafting chains its own features past
  the last verified one, as it would drafting ahead of verdicts. Measured here only (a prototype):
  the verifier does not hand hidden states to drafters.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace

import torch
import torch.nn.functional as F

from learned_drafter import K, acceptance, draft_ms_per_token, rollout, summarise, tally, write_report
from specactor.drafters.learned import LearnedDrafter, _dense_layer_state, frequent_vocab, set_head_vocab
from specactor.engine.model_registry import resolve_model
from specactor.prompts import humaneval_prompts
from specactor.tokenizer import Tokenizer
from specactor.engine.config import rope_inv_freq
from specactor.engine.llm_engine import Engine
from specactor.engine.model import CausalLM, apply_rope, rms_norm
from specactor.engine.sampler import _as_i32, _gumbel_rows, _token_key, row_keys
from specactor.engine.weights import load_causal_lm


def _rope(cfg, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = torch.outer(torch.arange(start, start + length).float(), rope_inv_freq(cfg))
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[:, None], emb.sin()[:, None]


def _layer(cfg, layer: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """One decoder layer over a whole sequence (causal, no cache), autograd-friendly."""
    t, hq, hkv, hd = x.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    qkv = layer.qkv(rms_norm(x, layer.input_norm, layer.eps))
    q = apply_rope(qkv[:, : hq * hd].view(t, hq, hd), cos, sin).transpose(0, 1)
    k = apply_rope(qkv[:, hq * hd: (hq + hkv) * hd].view(t, hkv, hd), cos, sin).transpose(0, 1)
    v = qkv[:, (hq + hkv) * hd:].view(t, hkv, hd).transpose(0, 1)
    attn = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, enable_gqa=True)[0]
    x = x + layer.o(attn.transpose(0, 1).reshape(t, hq * hd))
    gate, up = layer.gate_up(rms_norm(x, layer.post_norm, layer.eps)).chunk(2, dim=-1)
    return x + layer.down(F.silu(gate) * up)


@torch.no_grad()
def features(target: CausalLM, ids: list[int]) -> torch.Tensor:
    """The target's last hidden states (before its final norm), teacher-forced."""
    cos, sin = _rope(target.cfg, 0, len(ids))
    x = target.embed(torch.tensor(ids))
    for layer in target.layers:
        x = _layer(target.cfg, layer, x, cos, sin)
    return x


@torch.no_grad()
def teacher_probs(target: CausalLM, f: torch.Tensor, vocab: torch.Tensor) -> torch.Tensor:
    logits = target.lm_head(rms_norm(f, target.norm, target.cfg.rms_norm_eps)).float()
    return torch.softmax(logits, -1)[:, vocab]


def train_student(drafter: LearnedDrafter, data: list, soft: list | None, epochs: int, lr: float = 3e-4) -> float:
    """The drafter's own distillation loop, with soft labels when ``soft`` is given."""
    from specactor.drafters.learned import train_logits

    st = drafter.student
    to_local = torch.full((st.cfg.vocab_size,), -100, dtype=torch.long)
    to_local[st.vocab] = torch.arange(len(st.vocab))
    st.requires_grad_(True)
    st.embed.weight.requires_grad_(False)
    params = [p for p in st.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = torch.Generator().manual_seed(0)
    started = time.perf_counter()
    for _ in range(epochs):
        for i in torch.randperm(len(data), generator=rng).tolist():
            prompt, output = data[i]
            ids = torch.tensor(prompt + output)
            logq = torch.log_softmax(train_logits(st, ids[:-1])[len(prompt) - 1:], -1)
            if soft is None:
                loss = F.nll_loss(logq, to_local[ids[len(prompt):]], ignore_index=-100)
            else:
                loss = -(soft[i][len(prompt) - 1:-1].float() * logq).sum(-1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
    st.requires_grad_(False)
    drafter.reports.append(object())  # type: ignore[arg-type]  # "trained": it proposes from now on
    drafter.use_model(drafter._drafting_copy())
    return time.perf_counter() - started


class EagleHead(torch.nn.Module):
    """(f_t, token t+1) -> f_{t+1}, and the head's logits over ``vocab`` for token t+2."""

    def __init__(self, target: CausalLM, vocab: torch.Tensor) -> None:
        super().__init__()
        cfg, d = target.cfg, target.cfg.hidden_size
        self.cfg, self.embed, self.vocab = cfg, target.embed, vocab
        self.fuse = torch.nn.Linear(2 * d, d, bias=False)
        with torch.no_grad():  # start as "the feature passes through"
            self.fuse.weight.zero_()
            self.fuse.weight[:, :d].copy_(torch.eye(d))
        one = CausalLM(replace(cfg, num_layers=1, tie_word_embeddings=False))
        one.layers[0].load_state_dict(_dense_layer_state(target.layers[-1]))
        self.layer = one.layers[0]
        self.norm = torch.nn.Parameter(target.norm.detach().clone())
        self.head = torch.nn.Linear(d, len(vocab), bias=False)
        with torch.no_grad():
            self.head.weight.copy_(target.embed.weight[vocab] if cfg.tie_word_embeddings else target.lm_head.weight[vocab])

    def forward(self, feats: torch.Tensor, next_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.fuse(torch.cat((feats, self.embed(next_tokens).detach()), -1))
        cos, sin = _rope(self.cfg, 1, x.shape[0])
        h = _layer(self.cfg, self.layer, x, cos, sin)
        return h, self.head(rms_norm(h, self.norm, self.cfg.rms_norm_eps))


def train_eagle(head: EagleHead, data: list, feats: list, soft: list, epochs: int, lr: float = 5e-4) -> float:
    opt = torch.optim.AdamW(head.parameters(), lr=lr)
    rng = torch.Generator().manual_seed(0)
    started = time.perf_counter()
    for _ in range(epochs):
        for i in torch.randperm(len(data), generator=rng).tolist():
            prompt, output = data[i]
            ids, f = torch.tensor(prompt + output), feats[i]
            h, logits = head(f[:-2], ids[1:-1])  # pair t -> f_{t+1}, token t+2
            w = torch.zeros(h.shape[0])
            w[max(len(prompt) - 2, 0):] = 1.0  # predictions of output tokens
            reg = (F.smooth_l1_loss(h, f[1:-1], reduction="none").mean(-1) * w).sum() / w.sum()
            ce = (-(soft[i][1:-1].float() * torch.log_softmax(logits, -1)).sum(-1) * w).sum() / w.sum()
            opt.zero_grad(set_to_none=True)
            (reg + ce).backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
    return time.perf_counter() - started


@torch.no_grad()
def eagle_acceptance(head: EagleHead, target: CausalLM, seqs: list, temperature: float, stride: int = 8) -> dict:
    """``acceptance``'s rule for the EAGLE head: true features up to the last committed token's
    predecessor (what a verdict carries), then the head's own features for the rest of the chain."""
    hits, proposals = [0] * (K + 1), 0
    token_key = _token_key(head.cfg.vocab_size, torch.device("cpu"))[head.vocab]
    for seq in seqs:
        ids, out, p = seq.prompt_ids + seq.output_ids, seq.output_ids, len(seq.prompt_ids)
        f = features(target, ids)
        for n in range(0, len(out) - K, stride):
            last = p + n - 1  # the last committed token's position
            feats, toks, draft = f[:last], torch.tensor(ids[1:last + 1]), []
            for j in range(K):
                h, logits = head(feats, toks)
                scores = logits[-1].float()
                if temperature > 0:
                    keys = _as_i32(row_keys(torch.tensor([seq.seed]), torch.tensor([n + j])))
                    scores = scores / temperature + _gumbel_rows(keys, token_key)[0]
                draft.append(int(head.vocab[scores.argmax()]))
                feats, toks = torch.cat((feats, h[-1:])), torch.cat((toks, torch.tensor(draft[-1:])))
            tally(hits, draft, out[n:])
            proposals += 1
    return summarise(hits, proposals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--epochs", type=int, default=3, help="rollout seeds to train on (RL epochs' worth)")
    parser.add_argument("--train-passes", type=int, default=3, help="passes over the rollouts per design")
    parser.add_argument("--out", default="bench/results/drafter_designs.json")
    args = parser.parse_args()
    started = time.perf_counter()
    folder = resolve_model(None)
    tok = Tokenizer(folder)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in humaneval_prompts(12)]
    ids = [f"p{i}" for i in range(12)]
    target = load_causal_lm(folder)
    eos = set(target.cfg.eos_token_ids) | ({tok.eos_token_id} if tok.eos_token_id is not None else set())
    engine = Engine(load_causal_lm(folder), max_batch=64, max_len=max(map(len, prompts)) + args.max_tokens,
                    eos_token_ids=eos)
    train = [s for e in range(1, args.epochs + 1)
             for s in rollout(engine, prompts[:8], ids[:8], 4, 1.0, args.max_tokens, seed=e)]
    held = {t: rollout(engine, prompts[8:], ids[8:], 2, t, args.max_tokens, seed=99) for t in (1.0, 0.0)}
    data = [(s.prompt_ids, s.output_ids) for s in train]
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()} "
                    f"{torch.get_num_threads()} threads, torch {torch.__version__}", "args": vars(args),
                    "train_tokens": sum(len(o) for _, o in data), "designs": []}

    def record(row: dict) -> None:
        report["designs"].append(row)
        print(json.dumps(row), flush=True)

    probe = held[1.0][0]
    t0 = time.perf_counter()
    feats = [features(target, p + o) for p, o in data]
    features_s = time.perf_counter() - t0
    soft_by_vocab: dict[tuple[int, ...], list] = {}
    for layers in (2, 4):
        for labels in ("hard", "soft"):
            drafter = LearnedDrafter(target, layers=layers, max_slots=64, max_len=2048, max_train_s=None)
            for p, o in data:
                drafter.add_rollout(p, o)
            vocab = frequent_vocab(drafter.buffer, drafter.vocab_limit, always=drafter.eos)
            set_head_vocab(drafter.student, drafter._full_head, vocab)
            soft = None
            if labels == "soft":
                key = tuple(vocab)
                if key not in soft_by_vocab:
                    soft_by_vocab[key] = [teacher_probs(target, f, drafter.student.vocab).half() for f in feats]
                soft = soft_by_vocab[key]
            train_s = train_student(drafter, data, soft, args.train_passes)
            record({"design": f"student-{layers}-{labels}", "vocab": len(vocab), "train_s": round(train_s, 1),
                    "teacher_s": round(features_s, 1) if soft else 0.0,
                    "held_out_T1": acceptance(drafter, held[1.0], 1.0),
                    "held_out_T0": acceptance(drafter, held[0.0], 0.0),
                    "draft_ms_per_token": round(draft_ms_per_token(drafter, probe), 2)})
    head = EagleHead(target, drafter.student.vocab)
    soft = soft_by_vocab[tuple(drafter.student.vocab.tolist())]
    train_s = train_eagle(head, data, feats, soft, args.train_passes * 2)
    head.eval()
    one_layer = LearnedDrafter(target, layers=1, max_slots=64, max_len=2048)
    set_head_vocab(one_layer.student, one_layer._full_head, head.vocab.tolist())
    one_layer.reports.append(object())  # type: ignore[arg-type]
    one_layer.use_model(one_layer._drafting_copy())
    record({"design": "eagle", "vocab": len(head.vocab), "train_s": round(train_s, 1),
            "teacher_s": round(features_s, 1), "held_out_T1": eagle_acceptance(head, target, held[1.0], 1.0),
            "held_out_T0": eagle_acceptance(head, target, held[0.0], 0.0),
            "draft_ms_per_token": round(draft_ms_per_token(one_layer, probe), 2),
            "draft_cost_note": "a 1-layer student's cost (the same layer and head; the fuse adds one 2d x d matmul)"})
    write_report(args.out, report, started)


if __name__ == "__main__":
    main()
