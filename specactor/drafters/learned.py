"""The learned drafter: a small draft model distilled from the policy's own rollouts.

Why this design (token-only, independent of the target's hidden states):
it needs nothing from the verifier but the tokens it commits, so it works
behind any verifier backend (vLLM hands out no hidden states readily) and
drafts fully decoupled, ahead of the last verdict, like any other drafter.
An EAGLE-style drafter reads the target's last hidden state and usually
accepts more, but ties itself to our engine and must wait for each verdict's
features.

The network
    A Llama of ``layers`` layers (default 2) at the target's width. Its
    embedding is the target's, frozen; its layers start as copies of the
    target's first layers (early exit: the target's final norm and head read
    them from the start); its final norm is the target's. Its head covers a
    truncated vocabulary, the ``vocab`` tokens the policy emits most often in
    the rollouts seen so far (FR-Spec's observation: a few thousand tokens
    carry nearly all of the probability mass of one kind of text), initialised
    from the target's tied head rows. ``bench/learned_drafter.py`` measures its
    cost per drafted token against a target decode step.

Training (:func:`distil`)
    On the committed tokens of finished requests (``RolloutBuffer``: the most
    recent ones, bounded), next-token cross-entropy on the output tokens. At
    T=1 the committed tokens are samples of the target's distribution, so this
    is an unbiased estimate of the KL gradient towards it; at T=0 it fits the
    target's argmax. It runs between RL steps: as soon as the verifier has
    nothing left to run (``Rollouts.idle``: the RL step's rollout is over and
    the trainer computes the update), on the CPU, cut short if a request comes
    in first; and at a weight update if rollouts came that it has not trained
    on (:meth:`LearnedDrafter.load_weights`). The data are the most recent
    rollouts, which come from the policy that just ran. Until it has trained
    once it proposes nothing.

Drafting
    Through :class:`~specactor.drafters.model.ModelDrafter` (slot KV cache,
    rollback by common prefix, batched proposals), with the target's
    position-keyed noise over the truncated vocabulary: at T=1 a drafted token
    is accepted where the two distributions agree, and the output stays
    token-identical to autoregressive whatever it proposes.
"""

from __future__ import annotations

import copy
import math
import time
from collections import Counter, deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from specactor.drafters.base import DraftState
from specactor.drafters.model import ModelDrafter
from specactor.engine.config import rope_inv_freq
from specactor.engine.model import CausalLM, apply_rope, rms_norm
from specactor.engine.sampler import _as_i32, _gumbel_rows, _token_key, row_keys

#: The student's depth: it starts as the target's first layers.
DEFAULT_LAYERS = 2
DEFAULT_VOCAB = 4096


@dataclass
class TrainReport:
    """What one round of distillation did."""

    sequences: int
    tokens: int
    epochs: int
    seconds: float
    loss_first: float
    loss_last: float
    vocab: int
    interrupted: bool = False  # stopped early (a rollout began): dropped; the next round starts over


class RolloutBuffer:
    """The most recent finished samples (prompt ids, output ids), at most ``max_tokens`` tokens."""

    def __init__(self, max_tokens: int = 200_000) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.samples: deque[tuple[list[int], list[int]]] = deque()
        self.tokens = 0
        self.added = 0  # samples ever added (to know whether there is anything new)

    def add(self, prompt_ids: list[int], output_ids: list[int]) -> None:
        if not output_ids:
            return
        self.samples.append((list(prompt_ids), list(output_ids)))
        self.tokens += len(prompt_ids) + len(output_ids)
        self.added += 1
        while self.tokens > self.max_tokens and len(self.samples) > 1:
            old_prompt, old_output = self.samples.popleft()
            self.tokens -= len(old_prompt) + len(old_output)

    def output_counts(self) -> Counter[int]:
        counts: Counter[int] = Counter()
        for _, output in self.samples:
            counts.update(output)
        return counts

    def __len__(self) -> int:
        return len(self.samples)


def frequent_vocab(buffer: RolloutBuffer, size: int, always: Iterable[int] = ()) -> list[int]:
    """The ``size`` token ids the rollouts' outputs use most (``always`` included), sorted."""
    keep = set(always)
    for token, _ in buffer.output_counts().most_common():
        if len(keep) >= size:
            break
        keep.add(token)
    return sorted(keep)


def build_student(target: CausalLM, layers: int = DEFAULT_LAYERS, vocab: list[int] | None = None) -> CausalLM:
    """A copy of ``target``'s first ``layers`` layers (embedding, final norm) with a head over ``vocab``."""
    if not 1 <= layers <= target.cfg.num_layers:
        raise ValueError(f"layers must be in 1..{target.cfg.num_layers}, got {layers}")
    student = CausalLM(replace(target.cfg, num_layers=layers, tie_word_embeddings=False))
    with torch.no_grad():
        student.embed.weight.copy_(target.embed.weight)
        student.norm.copy_(target.norm)
        for mine, theirs in zip(student.layers, target.layers):
            mine.load_state_dict(_dense_layer_state(theirs))
    set_head_vocab(student, target.embed.weight if target.cfg.tie_word_embeddings else _dense(target.lm_head),
                   vocab or list(range(target.cfg.vocab_size)))
    return student.float()


def _dense(linear: torch.nn.Module) -> torch.Tensor:
    return linear.dense() if hasattr(linear, "dense") else linear.weight.detach()


def _dense_layer_state(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A layer's state dict with packed linears turned back into dense weights."""
    state = {}
    for name, module in layer.named_children():
        state[f"{name}.weight"] = _dense(module)
        bias = getattr(module, "bias", None)
        if bias is not None:
            state[f"{name}.bias"] = bias.detach()
    state["input_norm"], state["post_norm"] = layer.input_norm.detach(), layer.post_norm.detach()
    return state


def set_head_vocab(student: CausalLM, full_head: torch.Tensor, vocab: list[int]) -> None:
    """Point the student's head at ``vocab`` (rows of ``full_head``, the target's head weights)."""
    index = torch.tensor(vocab, dtype=torch.long)
    student.lm_head = torch.nn.Linear(student.cfg.hidden_size, len(vocab), bias=False)
    with torch.no_grad():
        student.lm_head.weight.copy_(full_head[index])
    student.vocab = index  # type: ignore[attr-defined]


def train_logits(student: CausalLM, tokens: torch.Tensor) -> torch.Tensor:
    """Causal forward of one sequence [T] -> logits [T, V] with autograd (no KV cache)."""
    cfg = student.cfg
    t = tokens.shape[0]
    positions = torch.arange(t)
    freqs = torch.outer(positions.float(), rope_inv_freq(cfg))
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    hq, hkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    x = student.embed(tokens)
    for layer in student.layers:
        h = rms_norm(x, layer.input_norm, layer.eps)
        qkv = layer.qkv(h)
        q = apply_rope(qkv[:, : hq * hd].view(t, hq, hd), cos, sin).transpose(0, 1)
        k = apply_rope(qkv[:, hq * hd: (hq + hkv) * hd].view(t, hkv, hd), cos, sin).transpose(0, 1)
        v = qkv[:, (hq + hkv) * hd:].view(t, hkv, hd).transpose(0, 1)
        attn = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, enable_gqa=True)[0]
        x = x + layer.o(attn.transpose(0, 1).reshape(t, hq * hd))
        h = rms_norm(x, layer.post_norm, layer.eps)
        gate, up = layer.gate_up(h).chunk(2, dim=-1)
        x = x + layer.down(F.silu(gate) * up)
    return student.lm_head(rms_norm(x, student.norm, cfg.rms_norm_eps))


#: One training round's passes over the buffer and learning rate. On 18k tokens of T=1 rollouts (8
#: HumanEval prompts x 4 x 768) a student right on 15% of held-out positions after 2 passes at 3e-4
#: is right on 21% after 3 at 1e-3 (20 s on 2 cores); more passes overfit (12 at 1e-3: 20%).
TRAIN_EPOCHS, TRAIN_LR = 3, 1e-3


def distil(student: CausalLM, buffer: RolloutBuffer, *, epochs: int = TRAIN_EPOCHS, lr: float = TRAIN_LR,
           max_seconds: float | None = None, seed: int = 0,
           should_stop: Callable[[], bool] | None = None) -> TrainReport:
    """Fit the student's next-token distribution to the rollouts' output tokens (in place).

    Output tokens outside the student's vocabulary are left out of the loss
    (the drafter can never propose them). The embedding stays frozen.
    ``should_stop`` is asked after every sample: True ends the round there (``interrupted``).
    """
    started = time.perf_counter()
    vocab: torch.Tensor = student.vocab  # type: ignore[attr-defined]
    to_local = torch.full((student.cfg.vocab_size,), -100, dtype=torch.long)
    to_local[vocab] = torch.arange(len(vocab))
    student.requires_grad_(True)
    student.embed.weight.requires_grad_(False)
    params = [p for p in student.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = torch.Generator().manual_seed(seed)
    samples = list(buffer.samples)
    losses: list[float] = []
    tokens_seen = 0
    done_epochs = 0
    interrupted = False
    for _ in range(epochs):
        for i in torch.randperm(len(samples), generator=rng).tolist():
            prompt, output = samples[i]
            ids = torch.tensor(prompt + output, dtype=torch.long)
            targets = to_local[ids[len(prompt):]]
            if (targets >= 0).sum() == 0:
                continue
            logits = train_logits(student, ids[:-1])[len(prompt) - 1:]
            loss = F.cross_entropy(logits, targets, ignore_index=-100)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimiser.step()
            losses.append(float(loss.detach()))
            tokens_seen += len(output)
            interrupted = should_stop is not None and should_stop()
            if interrupted or (max_seconds is not None and time.perf_counter() - started > max_seconds):
                break
        if interrupted:
            break
        done_epochs += 1
        if max_seconds is not None and time.perf_counter() - started > max_seconds:
            break
    student.requires_grad_(False)
    head = max(1, len(losses) // 10)
    return TrainReport(len(samples), tokens_seen, done_epochs, time.perf_counter() - started,
                       sum(losses[:head]) / head if losses else math.nan,
                       sum(losses[-head:]) / head if losses else math.nan, len(vocab), interrupted)


class LearnedDrafter(ModelDrafter):
    """Drafts with a small student model distilled from the rollouts (see the module docstring).

    Args:
        target: the target model (its weights seed the student; not kept).
        layers, vocab: the student's depth and head size.
        epochs, lr, max_train_s: one distillation round's passes, learning rate and time cap.
        buffer_tokens: rollout tokens kept for training (most recent).
    """

    name = "learned"

    def __init__(self, target: CausalLM, *, layers: int = DEFAULT_LAYERS, vocab: int = DEFAULT_VOCAB,
                 max_slots: int = 32, max_len: int = 1024, epochs: int = TRAIN_EPOCHS, lr: float = TRAIN_LR,
                 max_train_s: float | None = 120.0, buffer_tokens: int = 200_000, device: str = "cpu") -> None:
        if vocab < 2:
            raise ValueError(f"vocab must be >= 2, got {vocab}")
        self.student = build_student(target, layers, list(range(min(vocab, target.cfg.vocab_size))))
        self._full_head = (target.embed.weight if target.cfg.tie_word_embeddings
                           else _dense(target.lm_head)).detach().clone()
        self.vocab_limit = vocab
        self.epochs, self.lr, self.max_train_s = epochs, lr, max_train_s
        self.buffer = RolloutBuffer(buffer_tokens)
        self.trained_on = 0  # buffer.added at the last training round
        self.reports: list[TrainReport] = []
        self.eos: set[int] = set(target.cfg.eos_token_ids)
        super().__init__(self._drafting_copy(torch.device(device)), max_slots=max_slots, max_len=max_len,
                         noise="shared", device=device)

    @property
    def trained(self) -> bool:
        return bool(self.reports)

    def _drafting_copy(self, device: torch.device) -> CausalLM:
        """The student as it drafts: packed, on the drafting device. The student itself trains on
        the CPU (it is small, and a GPU's time belongs to the rollout); ``vocab`` is a plain
        attribute, so it moves by hand."""
        model = copy.deepcopy(self.student).eval().to(device)
        model.vocab = model.vocab.to(device)  # type: ignore[attr-defined]
        model.pack()
        return model

    # ------------------------------------------------------------------ data and training

    def add_rollout(self, prompt_ids: list[int], output_ids: list[int]) -> None:
        """A finished sample's committed tokens: training data for the next round."""
        self.buffer.add(prompt_ids, output_ids)

    @property
    def ready(self) -> bool:  # type: ignore[override]
        return self.trained

    @property
    def has_new_rollouts(self) -> bool:
        """The buffer holds samples the student has not been trained on."""
        return bool(len(self.buffer)) and self.buffer.added != self.trained_on

    def train(self, should_stop: Callable[[], bool] | None = None) -> TrainReport | None:
        """Distil on the buffer if it holds samples not trained on yet; swap the new student in.
        A round that ``should_stop`` cut short is dropped: the student stays as the last full round
        left it, and the samples stay new, so the next round takes them again from there."""
        if not self.has_new_rollouts:
            return None
        student = copy.deepcopy(self.student)  # the round's: kept only if it completes
        vocab = frequent_vocab(self.buffer, self.vocab_limit, always=self.eos)
        old = student.vocab.tolist()  # type: ignore[attr-defined]
        if vocab != old:  # keep what the head learnt for tokens that stay
            head = self._full_head.clone()
            head[torch.tensor(old)] = student.lm_head.weight.detach()
            set_head_vocab(student, head, vocab)
        report = distil(student, self.buffer, epochs=self.epochs, lr=self.lr, max_seconds=self.max_train_s,
                        should_stop=should_stop)
        if report.interrupted:
            return report
        self.student = student
        self.trained_on = self.buffer.added
        self.reports.append(report)
        self.use_model(self._drafting_copy(self.device))
        return report

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """The policy changed: take its new embedding and head. Rollouts not trained on yet are
        trained on now; where the student already learnt from every rollout (it trains while the
        verifier is idle, i.e. during the RL step that made these weights), it only takes the new
        embedding, so the update is not held up by a training round on the same data."""
        embed = state.get("model.embed_tokens.weight")
        if embed is None:
            raise KeyError("weight 'model.embed_tokens.weight' missing from the update")
        if tuple(embed.shape) != tuple(self.student.embed.weight.shape):
            raise ValueError(f"embedding of shape {tuple(embed.shape)} for a drafter of "
                             f"{tuple(self.student.embed.weight.shape)}")
        with torch.no_grad():
            self.student.embed.weight.copy_(embed.float())
        self._full_head = state.get("lm_head.weight", embed).detach().float().to("cpu", copy=True)
        if not (self.has_new_rollouts and self.train()):
            self.use_model(self._drafting_copy(self.device))

    # ------------------------------------------------------------------ drafting

    def propose(self, states: list[DraftState], k: int) -> list[list[int]]:
        if not self.trained:
            return [[] for _ in states]
        return super().propose(states, k)

    def _sample(self, logits: torch.Tensor, states: list[DraftState], positions: list[int]) -> list[int]:
        return sample_in_vocab(logits, self.model.vocab, [s.temperature for s in states],  # type: ignore[attr-defined]
                               [s.seed for s in states], positions, self.vocab_size)


def sample_in_vocab(logits: torch.Tensor, vocab: torch.Tensor, temperatures: list[float], seeds: list[int],
                    positions: list[int], vocab_size: int) -> list[int]:
    """The target's sampling rule and noise over a truncated vocabulary: rows of ``logits``
    [N, len(vocab)] -> token ids. The Gumbel noise of (seed, position, token) for the kept tokens
    is exactly what the target adds to them (``vocab_size``: the target's), and computing it for 4k
    tokens instead of 49k is most of a drafted token's cost. A row at temperature <= 0 is greedy."""
    temps = torch.tensor(temperatures, dtype=torch.float32, device=logits.device)
    greedy = temps <= 0
    scores = logits.float() / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
    if not bool(greedy.all()):
        keys = _as_i32(row_keys(torch.tensor(seeds, dtype=torch.int64, device=logits.device),
                                torch.tensor(positions, dtype=torch.int64, device=logits.device)))
        noise = _gumbel_rows(keys, _token_key(vocab_size, logits.device)[vocab])
        noise[greedy] = 0.0
        scores = scores + noise
    return vocab[scores.argmax(dim=-1)].tolist()


def learned_drafter(folder: str | Path, **options: object) -> LearnedDrafter:
    """A :class:`LearnedDrafter` seeded from the model in ``folder``."""
    from specactor.engine.weights import load_causal_lm

    return LearnedDrafter(load_causal_lm(Path(folder)), **options)  # type: ignore[arg-type]
