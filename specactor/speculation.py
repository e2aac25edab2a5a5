"""The shape of speculation that the verifier, the drafters and the policy share.

The names of the drafting methods, the window (how many drafted tokens a verify
step checks for a request) and how far a decoupled drafter runs ahead of the
last verdict. They live here, beneath all three, so that none of them imports
another for a constant.
"""

from __future__ import annotations

#: The drafting methods by name (specactor.drafters.registry builds them).
METHODS = ("ngram", "suffix", "model", "learned")

#: Methods that run a model: each gets a process of its own, is sized like the verifier (it drafts
#: for every running request) and holds a copy of the policy's weights, updated between RL steps.
MODEL_METHODS = ("model", "learned")

#: Methods that learn from the rollouts (the verifier streams every finished sample to them) and
#: draft nothing until they have: the policy leaves them out until their actor reports them ready.
LEARNING_METHODS = ("learned",)


#: The most draft tokens one verify step checks for a request (the policy picks 0..this per request).
#: 16, not 8: in the T=0 long-tail bench the tail is a few samples repeating themselves at ~100%
#: acceptance, and 17 tokens a step there beat 9 (tail 11.4 s against 11.9 s in three interleaved
#: pairs); where acceptance is lower the policy's cost model picks less.
DEFAULT_WINDOW = 16


def decoupled_lookahead(window: int) -> int:
    """How far a decoupled drafter runs ahead of the last verdict when the verifier verifies up
    to ``window`` of its tokens a step: the step in flight takes ``window`` tokens and commits one
    of its own after them, and the next step needs ``window`` more beyond that. With only
    ``window`` tokens of run-ahead, every step would find the drafts it needs still unwritten (the
    verdict that lets the drafter go on arrives after the next step started): measured on a T=0
    tail at window 8, steps verified 3-4 tokens a request at 100% acceptance."""
    return 2 * window + 1


#: Steps whose verdicts a drafter gets together while it drafts only for shadow-scored requests
#: (window 0: scored, never verified). Each drafting round costs the caller's process CPU, which on
#: 2 cores comes out of the verifier's forward: 1.2-2.8 ms a T=1 tail step with any request shadowed
#: when they came every step.
SHADOW_STRIDE = 4


def shadow_lookahead() -> int:
    """How far a drafter runs ahead for a shadow-scored request: one draft, drafted on the verdicts
    of SHADOW_STRIDE steps, must reach past the step in flight to the next release, so that a
    request repeating itself is scored on every step (a wrong draft is scored where it first
    disagrees, and the next comes SHADOW_STRIDE steps later)."""
    return decoupled_lookahead(1) + SHADOW_STRIDE - 1


#: StatsReply keys by which a model drafter tells the policy its measured cost table:
#: ``draft_cost_s/<batch>`` = seconds of one proposal round giving each of ``batch`` rows a token
#: (specactor.drafters.cost_profile measures it; specactor.policy.cost_model.DraftCost prices with it)
DRAFT_COST_STATS = "draft_cost_s/"
#: and its seconds per context token fed at once, as a request's first proposal feeds its prompt and
#: output so far (the policy waits that long for an exploration's first draft)
DRAFT_PREFILL_STATS = "draft_prefill_s"
