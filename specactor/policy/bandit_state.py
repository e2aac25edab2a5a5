"""What the Fastest-of-N policy knows and decides, as data: per-token acceptance posteriors
(:class:`Acceptance`), a request's state (:class:`RequestState`), a request's next
:class:`Choice`, and the constants of exploration and shadow scoring. The bandit
(:mod:`specactor.policy.bandit`) keeps them up to date; the planner
(:mod:`specactor.policy.planner`) turns them into a plan."""

from __future__ import annotations

from dataclasses import dataclass, field


SCHEMES = ("thompson", "ucb", "greedy")
#: committed tokens that, with the method and the draft's length, make drafts in a round one experiment
SAME_CONTEXT = 8
#: a free method's scores in a shadow period that judge it (right ``shadow_keep`` of them: it goes on)
SHADOW_EVIDENCE = 4
#: a shadow period without SHADOW_EVIDENCE scores yet (its drafts still on their way) is extended, up to this many periods
SHADOW_WAIT = 4
#: scores of a kept period that mark a change of text (its older misses are dropped); with 4, chance
#: runs at T=1 turned requests on that did not pay (32B GPU shape, held-out T=1: 0.96x -> 0.94x)
SHADOW_CHANGE = 8
#: while every request is off and no shadow-scored one looks like turning on (:meth:`FastestOfN.is_quiet`)
#: the PolicyActor plans, and asks the drafters for timings, this many times less often; the simulator
#: does the same
DORMANT_SLOWDOWN = 4
#: how the acceptance a choice is made on depends on the request's past drafts (see the module docstring)
ACCEPTANCE_MODELS = ("geometric", "markov")


@dataclass
class Acceptance:
    """Discounted Beta counts of per-token acceptance.

    A draft of which ``accepted`` tokens were right and the next one wrong is ``accepted``
    successes and one failure (the tokens after it are unknown): the geometric likelihood, to
    which the Beta is conjugate. Old evidence is discounted per token checked, not per draft:
    a shadowed request's draft is scored one committed token a step, and discounting per
    observation capped what 100% acceptance could show at ~10 tokens of evidence (the
    posterior then sat near 0.7 below a modest global estimate, and a tail that repeated
    itself exactly stayed off), while a verified 8-token draft counted 8."""

    successes: float = 0.0
    failures: float = 0.0

    def observe(self, drafted: int, accepted: int, decay: float) -> None:
        """``decay``: the weight left to old evidence per token checked."""
        if drafted <= 0:
            return
        failed = 1 if accepted < drafted else 0
        kept = decay ** (accepted + failed)
        self.successes = self.successes * kept + accepted
        self.failures = self.failures * kept + failed

    def revise(self, old: tuple[float, float], new: tuple[float, float]) -> None:
        """Replace counts ``old`` (successes, failures) added earlier by ``new``."""
        self.successes += new[0] - old[0]
        self.failures += new[1] - old[1]

    @property
    def mean(self) -> float:
        n = self.successes + self.failures
        return self.successes / n if n > 0 else 0.5

    @property
    def weight(self) -> float:
        return self.successes + self.failures


@dataclass
class Choice:
    """What one request does next."""

    methods: list[str]  # first = primary, then free riders and racers; empty = no speculation
    window: int
    decoupled: bool
    reason: str = ""
    race: bool = False  # verify every method's draft (token tree) instead of the longest one

    def same_as(self, other: "Choice | None") -> bool:
        return other is not None and (self.methods, self.window, self.decoupled, self.race) == (
            other.methods, other.window, other.decoupled, other.race)


def is_dormant(plan: dict[str, Choice]) -> bool:
    """Whether nothing in ``plan`` drafts or is shadow-scored: a plan rarely changes then, so it may
    come less often (for a policy that keeps no shadow periods; :meth:`FastestOfN.is_quiet` is the
    Fastest-of-N policy's own rule)."""
    return not any(choice.window or choice.methods for choice in plan.values())


@dataclass
class RequestState:
    """What the policy knows of one request: its acceptance evidence per method, its holds,
    explorations and shadow periods."""

    arms: dict[str, Acceptance] = field(default_factory=dict)
    # the markov model's evidence, per method: drafts after one right to its end, and after any other
    runs: dict[str, Acceptance] = field(default_factory=dict)
    fresh: dict[str, Acceptance] = field(default_factory=dict)
    in_run: dict[str, bool] = field(default_factory=dict)  # per method: its last scored draft was right to its end
    scored_at: dict[str, int] = field(default_factory=dict)  # per method: committed tokens when it was scored last
    committed: int = 0
    recent: tuple[int, ...] | None = None  # its last SAME_CONTEXT committed tokens (None: never told them)
    steps: int = 0
    hold_until: int = 0  # plan round before which the primary method is not switched
    draft_rates: dict[str, float] = field(default_factory=dict)  # share of steps with a draft, per method
    explore_at: int = 0  # plan round from which the request may explore again
    explore_gap: int = 0  # rounds to wait after its next exploration (doubles while they find nothing)
    drafts_seen: int = 0  # verified drafts of any method
    exploring: tuple[str, int] = ("", 0)  # (method, window) of an exploration still awaiting its first draft
    explore_seen: int = 0  # drafts_seen when it began
    explore_deadline: int = 0  # steps by which it gives up waiting
    shadow_to: float = 0.0  # plan round at which its current shadow period ends
    shadow_from: float = 0.0  # plan round from which its next one may start
    shadow_gap: int = 0  # rounds between the end of the next period and the one after (0: not yet set)
    shadow_start: float = 0.0  # plan round at which its current shadow period began
    period: dict[str, list[float]] = field(default_factory=dict)  # per method: [right, checked] this shadow period
    left: int = -1  # output tokens it may still generate (its max_tokens less its output; -1: not known)
    prompt_len: int = 0  # its prompt's tokens (0: not told)
    greedy: bool = False  # decoded at temperature 0
