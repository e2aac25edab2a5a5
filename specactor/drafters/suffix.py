"""Suffix and history drafting: longest-suffix match over the request, its siblings, earlier rollouts and a corpus.

In RL rollout every prompt is sampled ``n`` times and comes back in later
epochs, so the best drafts for a request are usually (a) its own prompt and
output so far (repeated code, lists, loops), (b) the outputs of its sibling
samples that are in flight, (c) earlier epochs' outputs for the same prompt and
(d) recent outputs of any prompt. ``SuffixDrafter`` matches the longest suffix
of the request's context (up to ``max_match`` tokens) against all four sources
at once and proposes what followed, in the spirit of SuffixDecoding (draft
length grows with the match length; stop where the continuations disagree).
Siblings and history are grouped by the prompt's token ids (a 128-bit digest),
never by request ids.

Data structure: an n-gram hash index plus backward extension, not a suffix
tree or automaton. Each source maps the hash of every n-gram (n = 1 ..
``index_n``, default 4) to the positions that followed it. A query hashes the
last n tokens of the context (longest n first), looks the positions up and
extends each match *backwards* by direct comparison up to ``max_match``
tokens, which gives the exact match length (and discards hash collisions). Why:

* the query is stateless: it only reads ``state.context()``, so a rollback
  (discarded lookahead) needs no undo, unlike a streaming automaton state;
* finished sequences live in FIFO stores (one buffer, positions only grow), so
  every per-key position list is sorted and evicting the oldest sequence drops
  a prefix of each list it touched: eviction is exact and cheap, where a
  suffix tree or automaton over many sequences cannot delete one cheaply;
* it is a few dozen dict look-ups and short list comparisons per proposal
  (about 0.1 ms in pure Python for a 500-token context with 16 earlier
  outputs and 16 siblings), and memory is ``index_n`` positions per token
  (about 300 bytes per stored token in all), where a depth-D suffix tree costs
  up to D Python nodes per token.

The price is an approximation: only the ``max_candidates`` most recent
occurrences of a key (per source) are extended, so a longer match at an older
occurrence of a very common n-gram can be missed. That only costs speed.

Drafting walks the candidates that share the longest match like a suffix-tree
walk with counts: at each step the most frequent next token wins (ties go to
the most recent occurrence), the walk keeps the candidates that agree, and the
path probability (product of ``count / alive``) must stay above
``min_confidence``. The draft is at most ``min(k, ceil(alpha * match_len))``
tokens. A match inside the request itself may continue into its lookahead and
into the draft being built, so a loop in the output is drafted beyond its end.

A finished output is stored with the last ``max_match`` prompt tokens in front
of it, so that a new sample of the prompt is drafted from its first token; the
corpus copy (output only) is skipped for a prompt whose history holds it, so
one output is not counted twice.

Memory is bounded: history keeps at most ``max_history_per_prompt`` outputs per
prompt for at most ``max_prompts`` prompts (LRU) and ``max_history_tokens``
tokens in all; the corpus keeps the most recent ``max_corpus_tokens`` output
tokens (FIFO). Per-request structures (and a prompt's shared index once no
request uses it) are freed in ``finish``. Token ids must be non-negative
(-1 separates sequences inside a store).

Thread safety: the DraftActor runs ``propose`` on a worker thread and queues
the verdicts that arrive meanwhile, applying them after the proposal, so in
the actor they never interleave. Every entry point still takes one re-entrant
lock (``propose`` per request), so a caller that does apply verdicts
(``observe``, ``finish``, ``start``) from another thread during a proposal is
safe too.
"""

from __future__ import annotations

import hashlib
import math
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from dataclasses import dataclass, field

from specactor.drafters.base import DraftState

_SEP = -1  # separates sequences in a store; never equals a token id

_MUL = 0x9E3779B97F4A7C15  # keys: a 64-bit polynomial hash of the n-gram (collisions are caught by comparison)
_MASK = (1 << 64) - 1

Index = dict[int, "int | list[int]"]  # n-gram key -> position(s) that followed it, ascending


def _prompt_key(prompt_ids: list[int]) -> bytes:
    """A 128-bit digest of the prompt: groups siblings and epochs, compact to keep."""
    return hashlib.blake2b(array("q", prompt_ids).tobytes(), digest_size=16).digest()


def _index_positions(index: Index, tokens: list[int], lo: int, hi: int, first: int, max_n: int,
                     offset: int = 0) -> None:
    """Index positions ``lo <= e < hi``: each n-gram ``tokens[e-n:e]`` (n <= max_n, not before ``first``)
    maps to ``offset + e``, the position that followed it."""
    get = index.get
    for e in range(lo, hi):
        g = offset + e
        h = 0
        for n in range(1, min(max_n, e - first) + 1):
            h = (h * _MUL + tokens[e - n] + 1) & _MASK  # the key of tokens[e-n:e], grown leftwards
            v = get(h)
            if v is None:
                index[h] = g  # most keys occur once: a bare int saves a list (half the memory and time)
            elif v.__class__ is int:
                index[h] = [v, g]
            else:
                v.append(g)


def _suffix_keys(suffix: list[int], max_n: int) -> list[int]:
    """Keys of the last n tokens of ``suffix`` for n = 1 .. max_n (as ``_index_positions`` computes them)."""
    keys, h = [], 0
    for n in range(1, min(max_n, len(suffix)) + 1):
        h = (h * _MUL + suffix[-n] + 1) & _MASK
        keys.append(h)
    return keys


def _drop_before(index: Index, key: int, end: int) -> None:
    """Remove the positions before ``end`` from ``key``'s entry (sorted: they are a prefix)."""
    v = index.get(key)
    if v is None:
        return
    if v.__class__ is int:
        if v < end:
            del index[key]
        return
    cut = bisect_left(v, end)
    if cut == len(v):
        del index[key]
    elif cut:
        del v[:cut]


class _Store:
    """Finished sequences in one buffer with FIFO eviction and an n-gram index of global positions.

    Buffer index ``i`` is global position ``base + i``; global positions only grow,
    so each key's position list is sorted and eviction drops a prefix of it.
    """

    def __init__(self, index_n: int) -> None:
        self.index_n = index_n
        self.buf: list[int] = []
        self.base = 0
        self.starts: list[int] = []  # global position of each sequence's first token
        self.firsts: list[int] = []  # offset of each sequence's first indexed position
        self.ticks: list[int] = []  # when each sequence was added: recency, and identity across stores
        self.index: Index = {}
        self.tokens = 0

    def __len__(self) -> int:
        return len(self.starts)

    def add(self, tokens: list[int], first: int, tick: int) -> None:
        """Append a sequence; positions before ``first`` are context only (never proposed)."""
        self.buf.append(_SEP)
        lo = len(self.buf)
        self.buf.extend(tokens)
        self.starts.append(self.base + lo)
        self.firsts.append(first)
        self.ticks.append(tick)
        self.tokens += len(tokens)
        _index_positions(self.index, self.buf, lo + max(first, 1), len(self.buf), lo, self.index_n, self.base)

    def evict_oldest(self) -> int:
        """Drop the oldest sequence and its index entries; returns its token count."""
        start = self.starts.pop(0)
        first = self.firsts.pop(0)
        del self.ticks[0]
        end = self.starts[0] - 1 if self.starts else self.base + len(self.buf)  # exclusive
        lo, hi = start - self.base, end - self.base
        buf = self.buf
        for e in range(lo + max(first, 1), hi):
            h = 0
            for n in range(1, min(self.index_n, e - lo) + 1):
                h = (h * _MUL + buf[e - n] + 1) & _MASK
                _drop_before(self.index, h, end)
        del self.buf[:hi]
        self.base = end
        self.tokens -= hi - lo
        return hi - lo

    def doc_of(self, g: int) -> int:
        """Which stored sequence holds global position ``g``."""
        return bisect_right(self.starts, g) - 1


@dataclass
class _Request:
    """A request in flight: its prompt + committed tokens and an index of its output positions."""

    group: _Group
    tokens: list[int]  # prompt + committed (as observed so far)
    prompt_len: int
    index: Index = field(default_factory=dict)
    tick: int = 0  # last update (recency for siblings)


@dataclass
class _Group:
    """Everything known about one prompt: its in-flight samples and its earlier outputs."""

    key: bytes
    prompt_len: int = 0
    prompt_index: Index | None = None  # shared by the in-flight samples, freed when none is left
    active: dict[str, _Request] = field(default_factory=dict)
    history: _Store | None = None


class SuffixDrafter:
    """Longest-suffix drafting over the request, its siblings, earlier rollouts and a corpus.

    Implements the Drafter protocol (``start``, ``propose``, ``observe``, ``finish``); the
    instance outlives calls so that history carries over epochs. ``memory_tokens``,
    ``history_outputs`` and ``stats`` report what it holds.
    """

    name = "suffix"
    lookup = True  # a proposal is a lookup, not a model: the actor drafts all the room in one round

    def __init__(
        self,
        max_match: int = 32,
        index_n: int = 4,
        min_match: int = 1,
        alpha: float = 1.0,
        min_confidence: float = 0.1,
        max_candidates: int = 32,
        max_history_per_prompt: int = 16,
        max_prompts: int = 4096,
        max_history_tokens: int = 1_000_000,
        max_corpus_tokens: int = 200_000,
    ) -> None:
        def check_int(name: str, value: object, low: int) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low} (got {value!r})")

        check_int("max_match", max_match, 1)
        check_int("index_n", index_n, 1)
        check_int("min_match", min_match, 1)
        check_int("max_candidates", max_candidates, 1)
        for name, value in (("max_history_per_prompt", max_history_per_prompt), ("max_prompts", max_prompts),
                            ("max_history_tokens", max_history_tokens), ("max_corpus_tokens", max_corpus_tokens)):
            check_int(name, value, 0)  # 0 turns that source off
        if index_n > max_match:
            raise ValueError(f"index_n must be <= max_match (got index_n={index_n}, max_match={max_match})")
        if min_match > max_match:
            raise ValueError(f"min_match must be <= max_match (got min_match={min_match}, max_match={max_match})")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
            raise ValueError(f"alpha must be a finite number > 0 (got {alpha!r})")
        if (isinstance(min_confidence, bool) or not isinstance(min_confidence, (int, float))
                or not 0.0 <= min_confidence <= 1.0):
            raise ValueError(f"min_confidence must be a number in [0, 1] (got {min_confidence!r})")
        self.max_match, self.index_n, self.min_match = max_match, index_n, min_match
        self.alpha, self.min_confidence, self.max_candidates = float(alpha), float(min_confidence), max_candidates
        self.max_history_per_prompt, self.max_prompts = max_history_per_prompt, max_prompts
        self.max_history_tokens, self.max_corpus_tokens = max_history_tokens, max_corpus_tokens
        self._requests: dict[str, _Request] = {}
        self._groups: OrderedDict[bytes, _Group] = OrderedDict()  # LRU order, oldest first
        self._corpus = _Store(index_n)
        self._history_tokens = 0
        self._history_prompts = 0
        self._clock = 0
        self._lock = threading.RLock()  # propose runs on a worker thread, verdicts on the event loop

    # ------------------------------------------------------------ lifecycle

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def start(self, state: DraftState) -> None:
        """Index the prompt (once per prompt, shared by its samples) and join the prompt's group."""
        with self._lock:
            self._start(state)

    def _start(self, state: DraftState) -> None:
        if state.request_id in self._requests:
            self._drop(self._requests.pop(state.request_id))  # a restart: forget the old one
        key = _prompt_key(state.prompt_ids)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(key)
        self._groups.move_to_end(key)
        prompt = list(state.prompt_ids)
        if group.prompt_index is None:
            group.prompt_len = len(prompt)
            group.prompt_index = {}
            _index_positions(group.prompt_index, prompt, 1, len(prompt), 0, self.index_n)
        req = _Request(group, prompt, len(prompt), tick=self._tick())
        group.active[state.request_id] = req
        self._requests[state.request_id] = req
        self._sync(req, state)

    def observe(self, state: DraftState, start: int, tokens: list[int]) -> None:
        """Index newly committed tokens; siblings see them at their next proposal.

        A verdict for an unknown or finished request is ignored (re-registering it would leak it)."""
        with self._lock:
            req = self._requests.get(state.request_id)
            if req is not None:
                self._sync(req, state)

    def _sync(self, req: _Request, state: DraftState) -> None:
        """Catch up with ``state.committed`` (verdicts only ever append to it)."""
        have = len(req.tokens) - req.prompt_len
        if len(state.committed) > have:
            lo = len(req.tokens)
            req.tokens.extend(state.committed[have:])
            _index_positions(req.index, req.tokens, max(lo, 1), len(req.tokens), 0, self.index_n)
            req.tick = self._tick()

    def finish(self, state: DraftState) -> None:
        """Move the output into the prompt's history and the corpus; free the per-request state."""
        with self._lock:
            self._finish(state)

    def _finish(self, state: DraftState) -> None:
        req = self._requests.get(state.request_id)
        if req is None:
            return
        self._sync(req, state)
        del self._requests[state.request_id]
        group = req.group
        output = req.tokens[req.prompt_len:]
        tick = self._tick()
        if output and self.max_history_per_prompt and self.max_prompts and self.max_history_tokens:
            tail = req.tokens[max(0, req.prompt_len - self.max_match):req.prompt_len]
            doc = (tail + output)[: self.max_history_tokens]
            if group.history is None:
                group.history = _Store(self.index_n)
                self._history_prompts += 1
            group.history.add(doc, len(tail), tick)
            self._history_tokens += len(doc)
            while len(group.history) > self.max_history_per_prompt:
                self._history_tokens -= group.history.evict_oldest()
        if output and self.max_corpus_tokens:
            self._corpus.add(output[: self.max_corpus_tokens], 0, tick)  # same tick: the same output
            while self._corpus.tokens > self.max_corpus_tokens:
                self._corpus.evict_oldest()
        self._groups.move_to_end(group.key)
        self._drop(req)
        self._enforce_history()

    def _drop(self, req: _Request) -> None:
        """Forget an in-flight request; free its prompt's index when no sample is left."""
        group = req.group
        for rid, other in list(group.active.items()):
            if other is req:
                del group.active[rid]
        if not group.active:
            group.prompt_index = None
            if group.history is None:
                self._groups.pop(group.key, None)

    def _enforce_history(self) -> None:
        """Evict the least recently used prompts' history until within max_prompts and max_history_tokens."""
        while self._history_prompts > self.max_prompts or self._history_tokens > self.max_history_tokens:
            group = next(g for g in self._groups.values() if g.history is not None)
            if self._history_prompts > self.max_prompts or len(group.history) == 1:
                self._history_tokens -= group.history.tokens
                group.history = None
                self._history_prompts -= 1
                if not group.active:
                    del self._groups[group.key]
            else:
                self._history_tokens -= group.history.evict_oldest()

    # ------------------------------------------------------------ drafting

    def propose(self, states: list[DraftState], k: int) -> list[list[int]]:
        """Up to ``k`` tokens continuing each state's context (prompt + committed + lookahead).

        A request that was not started (or has finished) gets an empty draft."""
        if k < 0:
            raise ValueError(f"k must be >= 0 (got {k})")
        drafts = []
        for state in states:
            with self._lock:  # per request: verdicts wait for one proposal, not the batch
                drafts.append(self._propose_one(state, k) if k else [])
        return drafts

    def _propose_one(self, state: DraftState, k: int) -> list[int]:
        req = self._requests.get(state.request_id)
        if req is None:
            return []  # not started, or finished while the caller's batch was in flight
        self._sync(req, state)
        own = req.tokens
        lookahead = list(state.lookahead)  # one snapshot: the event loop may change it meanwhile
        # the context's last max_match tokens (prompt + committed + lookahead)
        if len(lookahead) >= self.max_match:
            suffix = lookahead[-self.max_match:]
        else:
            suffix = own[max(0, len(own) - self.max_match + len(lookahead)):] + lookahead
        s = len(suffix)
        if s == 0:
            return []
        group = req.group
        now = self._clock + 1  # own occurrences are the most recent
        # (index, tokens, base of its positions, recency tick (stores: per sequence), store, is own)
        sources: list[tuple[Index, list[int], int, int, _Store | None, bool]] = []
        if group.prompt_index:
            sources.append((group.prompt_index, own, 0, now, None, True))
        sources.append((req.index, own, 0, now, None, True))
        for sib in group.active.values():
            if sib is not req:
                sources.append((sib.index, sib.tokens, 0, sib.tick, None, False))
        if group.history is not None:
            sources.append((group.history.index, group.history.buf, group.history.base, 0, group.history, False))
        in_history = set(group.history.ticks) if group.history is not None else set()
        if self._corpus.starts:
            sources.append((self._corpus.index, self._corpus.buf, self._corpus.base, 0, self._corpus, False))

        cands: list[tuple[int, tuple[int, int], list[int], int, bool]] = []
        keys = _suffix_keys(suffix, self.index_n)
        for n in range(len(keys), 0, -1):
            key = keys[n - 1]
            for index, tokens, base, tick, store, is_own in sources:
                v = index.get(key)
                if v is None:
                    continue
                for g in ((v,) if v.__class__ is int else v[-self.max_candidates:]):
                    p = g - base
                    if store is not None:
                        doc = store.doc_of(g)
                        if store is self._corpus and store.ticks[doc] in in_history:
                            continue  # the same output, already a candidate from this prompt's history
                        rec = (store.ticks[doc], g)
                    else:
                        rec = (tick, p)
                    limit = min(s, p, self.max_match)
                    if tokens[p - limit:p] == suffix[s - limit:]:
                        m = limit
                    else:
                        m = 0
                        while m < limit and tokens[p - 1 - m] == suffix[s - 1 - m]:
                            m += 1
                    if m >= n:  # else a hash collision
                        cands.append((m, rec, tokens, p, is_own))
            if cands:
                break
        if not cands:
            return []
        best = max(c[0] for c in cands)
        if best < self.min_match:
            return []
        return self._walk([c for c in cands if c[0] == best], min(k, math.ceil(self.alpha * best)),
                          len(own), lookahead)

    def _walk(self, alive: list[tuple[int, tuple[int, int], list[int], int, bool]], limit: int, own_len: int,
              ext: list[int]) -> list[int]:
        """Follow the candidates token by token: majority next token (ties: most recent), stop when
        the path probability drops below min_confidence. ``ext`` is the own context past ``own_len``
        (lookahead, then the draft), so a match in the request itself runs on into its own draft."""
        draft: list[int] = []
        confidence = 1.0
        for j in range(limit):
            tally: dict[int, list] = {}
            nexts: list[int] = []
            for _, rec, tokens, p, is_own in alive:
                i = p + j
                if i < len(tokens):
                    t = tokens[i]
                elif is_own:
                    t = ext[i - own_len]  # exists: p < own_len, and ext grows by one per step
                else:
                    t = _SEP
                nexts.append(t)
                if t == _SEP:
                    continue  # this occurrence ended (counts against the confidence)
                entry = tally.get(t)
                if entry is None:
                    tally[t] = [1, rec]
                else:
                    entry[0] += 1
                    if rec > entry[1]:
                        entry[1] = rec
            if not tally:
                break
            token = max(tally, key=lambda t: tally[t])
            confidence *= tally[token][0] / len(alive)
            if confidence < self.min_confidence:
                break
            draft.append(token)
            ext.append(token)
            alive = [c for c, t in zip(alive, nexts) if t == token]
        return draft

    # ------------------------------------------------------------ introspection

    def memory_tokens(self) -> int:
        """Tokens held in all indexed structures: shared prompts, in-flight outputs, history, corpus."""
        with self._lock:
            return self._memory_tokens()

    def _memory_tokens(self) -> int:
        prompts = sum(g.prompt_len for g in self._groups.values() if g.prompt_index is not None)
        outputs = sum(len(r.tokens) - r.prompt_len for r in self._requests.values())
        return prompts + outputs + self._history_tokens + self._corpus.tokens

    def history_outputs(self, prompt_ids: list[int]) -> int:
        """How many earlier outputs are kept for this prompt."""
        key = _prompt_key(prompt_ids)
        with self._lock:
            group = self._groups.get(key)
            return 0 if group is None or group.history is None else len(group.history)

    def stats(self) -> dict[str, int]:
        """Sizes of every structure (for tests and events)."""
        with self._lock:
            return self._stats()

    def _stats(self) -> dict[str, int]:
        stores = [g.history for g in self._groups.values() if g.history is not None] + [self._corpus]
        indexes = [s.index for s in stores] + [r.index for r in self._requests.values()]
        indexes += [g.prompt_index for g in self._groups.values() if g.prompt_index is not None]
        return {
            "active_requests": len(self._requests),
            "prompts": len(self._groups),
            "history_prompts": self._history_prompts,
            "history_outputs": sum(len(s) for s in stores[:-1]),
            "history_tokens": self._history_tokens,
            "corpus_outputs": len(self._corpus),
            "corpus_tokens": self._corpus.tokens,
            "index_entries": sum(1 if v.__class__ is int else len(v) for ix in indexes for v in ix.values()),
            "memory_tokens": self._memory_tokens(),
        }
