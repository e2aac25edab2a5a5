"""Replaying a sample's own tokens through a drafter that drafts on every step.

Under specactor's position-keyed sampling a draft token is accepted iff it equals the token
the sample committed at that position (at any temperature), so a finished sample's tokens give
every drafter's exact acceptance, step by step, with no model run: what the drafter would have
made of the sample with no policy deciding where drafts pay. ``bench/drafter_steps.py`` runs it
on a rollout's output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable, Iterator

from specactor.compressed import read_text

#: drafters ``replay`` knows; "arctic" needs arctic-inference (vLLM's suffix decoding)
DRAFTERS = ("ngram", "suffix", "arctic")

Proposer = Callable[[list[int], int], list[int]]  # (committed output so far, window) -> draft


def load_rollout(path: str | Path) -> list[dict]:
    """The samples of a ``specactor rollout`` output file (JSON lines with id, sample, prompt_ids and
    token_ids; plain or gzip-compressed); ValueError naming the file and line of anything else."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no rollout file at {path}")
    rows = []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows.append({"id": str(row["id"]), "sample": int(row["sample"]), "prompt_ids": list(row["prompt_ids"]),
                         "token_ids": list(row["token_ids"]), "stats": row.get("stats") or {},
                         "finish_reason": row.get("finish_reason")})
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path} line {number} is not a rollout sample (id, sample, prompt_ids, token_ids): "
                             f"{exc!r}") from None
    return rows


def _specactor(name: str, prompt: list[int]) -> tuple[Proposer, Callable[[int, list[int]], None]]:
    from specactor.drafters.base import DraftState
    from specactor.drafters.ngram import NgramDrafter
    from specactor.drafters.suffix import SuffixDrafter

    drafter = NgramDrafter() if name == "ngram" else SuffixDrafter()
    state = DraftState("replay", list(prompt), [])
    drafter.start(state)

    def commit(start: int, tokens: list[int]) -> None:
        state.committed += tokens
        drafter.observe(state, start, tokens)

    return (lambda _out, window: drafter.propose([state], window)[0][:window]), commit


def _arctic(prompt: list[int]) -> tuple[Proposer, Callable[[int, list[int]], None]]:
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    depth = 24
    cache = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=0)
    cache.start_request("replay", list(prompt))

    def propose(out: list[int], window: int) -> list[int]:
        context = (list(prompt) + out)[-depth:]
        return list(cache.speculate("replay", context, max_spec_tokens=window).token_ids)[:window]

    return propose, lambda _start, tokens: cache.add_active_response("replay", tokens)


def replay_steps(prompt: list[int], output: list[int], drafter: str,
                 window: int) -> Iterator[tuple[int, list[int], int]]:
    """Each step of ``drafter`` drafting up to ``window`` tokens on every step of ``output``:
    (output position the draft starts at, the draft, how many of its tokens were right). The
    step commits the right ones and the verifier's own token."""
    if drafter not in DRAFTERS:
        raise ValueError(f"unknown drafter {drafter!r}: choose from {', '.join(DRAFTERS)}")
    if window < 1:
        raise ValueError(f"window must be at least 1 (got {window})")
    propose, commit = _arctic(prompt) if drafter == "arctic" else _specactor(drafter, prompt)
    t = 0
    while t < len(output):
        draft = propose(output[:t], window)
        ok = 0
        while ok < len(draft) and t + ok < len(output) and draft[ok] == output[t + ok]:
            ok += 1
        yield t, draft, ok
        new = output[t:t + min(ok + 1, len(output) - t)]
        commit(t, new)
        t += len(new)


#: what the step before a draft made of its own draft (``tally``'s ``after``)
OUTCOMES = ("none", "miss", "partial", "full")


def tally(steps: Iterable[tuple[int, list[int], int]], length: int, window: int) -> dict:
    """Steps, drafted and accepted tokens of replayed ``steps`` (``replay_steps``' (start, draft,
    right) over a sample of ``length`` tokens), and two views of acceptance that one per-token p
    (the cost model's) cannot give:

    - ``reached[k]``, ``right[k]`` (k from 0): drafts that had a token k, with every token before
      it right and the sample not over at it, and those whose token k was right too: the chance of
      token k given the ones before it;
    - ``after[outcome]``: [drafts, drafted, accepted] of the drafts (with tokens) that followed a
      step with no draft (or none at all: a sample's first draft), a draft wrong from its first
      token, one partly right, or one right to its end (a draft running past the sample's end
      counts as right to its end if every token the sample had was right; its drafted tokens
      past the end count in ``drafted``, as in the totals).
    """
    count = drafted = accepted = 0
    reached, right = [0] * window, [0] * window
    after = {o: [0, 0, 0] for o in OUTCOMES}
    last = "none"
    for start, draft, ok in steps:
        count, drafted, accepted = count + 1, drafted + len(draft), accepted + ok
        for k in range(min(ok + 1, len(draft), length - start)):
            reached[k] += 1
            right[k] += k < ok
        if draft:
            seen = after[last]
            seen[0], seen[1], seen[2] = seen[0] + 1, seen[1] + len(draft), seen[2] + ok
        last = "none" if not draft else "full" if ok == min(len(draft), length - start) else \
            "partial" if ok else "miss"
    return {"steps": count, "drafted": drafted, "accepted": accepted, "reached": reached, "right": right,
            "after": after}


def replay(prompt: list[int], output: list[int], drafter: str, window: int) -> dict:
    """``tally`` of ``drafter`` drafting up to ``window`` tokens on every step of ``output`` (each
    step commits the matching prefix and the verifier's own token): its steps, drafted and
    accepted tokens, and acceptance by draft position and by the draft before."""
    return tally(replay_steps(prompt, output, drafter, window), len(output), window)
