"""DraftActor: how far a decoupled drafter runs ahead, and in how many rounds."""

from __future__ import annotations

import asyncio

import pytest

from specactor import protocol as p
from specactor.actor import ActorSystem
from specactor.actor.probes import Collector
from specactor.drafters import actor as actor_module
from specactor.drafters.actor import DraftActor
from specactor.speculation import decoupled_lookahead
from specactor.drafters.ngram import NgramDrafter

WINDOW = 8
#: 40 distinct tokens, twice: prompt lookup continues the second copy with the first's tokens
SEGMENT = list(range(100, 140))


async def _batches(verifier: Collector, quiet_s: float = 0.3) -> list[list[p.Draft]]:
    """Every DraftBatch's non-empty drafts until the drafter has been quiet for ``quiet_s``."""
    out: list[list[p.Draft]] = []
    while True:
        try:
            _, msg = await asyncio.wait_for(verifier.received.get(), quiet_s)
        except asyncio.TimeoutError:
            return out
        assert isinstance(msg, p.DraftBatch)
        out.append([d for d in msg.drafts if d.tokens])


async def _drafts(verifier: Collector, quiet_s: float = 0.3) -> list[p.Draft]:
    """Every Draft the drafter sends until it has been quiet for ``quiet_s``."""
    return [d for batch in await _batches(verifier, quiet_s) for d in batch]


async def _start(system: ActorSystem, k: int = 4) -> Collector:
    verifier = Collector("verifier")
    await system.spawn(verifier)
    await system.spawn(DraftActor("draft-ngram", "ngram", verifier="verifier", k=k, window=WINDOW))
    return verifier


def _track(mode: p.DraftMode, window: int) -> p.Track:
    return p.Track(request_id="r", context_ids=SEGMENT + SEGMENT[:4], prompt_len=len(SEGMENT) + 4,
                   window=window, mode=mode)


async def _one_decoupled_request() -> tuple[DraftActor, list[p.Draft]]:
    """An ngram DraftActor (k=4) given one decoupled request: the actor, and every draft it sent."""
    async with ActorSystem("inproc") as system:
        verifier = Collector("verifier")
        await system.spawn(verifier)
        drafter = DraftActor("draft-ngram", "ngram", verifier="verifier", k=4, window=WINDOW)
        await system.spawn(drafter)
        await verifier.send("draft-ngram", _track(p.DraftMode.DECOUPLED, decoupled_lookahead(WINDOW)))
        return drafter, await _drafts(verifier)


async def test_a_decoupled_lookup_drafter_fills_the_step_in_flight_and_the_next_in_one_round() -> None:
    lookahead = decoupled_lookahead(WINDOW)
    async with ActorSystem("inproc") as system:
        verifier = await _start(system)
        await verifier.send("draft-ngram", _track(p.DraftMode.DECOUPLED, lookahead))
        drafts = await _drafts(verifier)
        # a step verifies WINDOW tokens and commits one of its own: the next step's WINDOW come after
        assert [(d.start, d.tokens) for d in drafts] == [(0, SEGMENT[4:4 + lookahead])]
        # a step commits 9 of them: the drafter tops the run-ahead up again, from where it stood
        await verifier.send("draft-ngram", p.VerdictBatch(step=1, verdicts=[
            p.Verdict(request_id="r", start=0, tokens=SEGMENT[4:13], accepted=8, drafted=8)]))
        drafts = await _drafts(verifier)
        assert [(d.start, d.tokens) for d in drafts] == [(lookahead, SEGMENT[4 + lookahead:4 + 9 + lookahead])]


@pytest.mark.parametrize("coalesce_s", [0.0, 60.0])
async def test_a_drafter_that_is_not_a_lookup_drafts_k_tokens_a_round_and_sends_rounds_together(
        monkeypatch: pytest.MonkeyPatch, coalesce_s: float) -> None:
    """Rounds in quick succession go to the verifier as one DraftBatch, a request's contiguous
    pieces as one draft (each message costs the verifier's event loop time its step needs);
    with no time to hold them, one message a round."""
    monkeypatch.setattr(NgramDrafter, "lookup", False)
    monkeypatch.setattr(actor_module, "COALESCE_S", coalesce_s)
    lookahead = decoupled_lookahead(WINDOW)
    async with ActorSystem("inproc") as system:
        verifier = Collector("verifier")
        await system.spawn(verifier)
        drafter = DraftActor("draft-ngram", "ngram", verifier="verifier", k=4, window=WINDOW)
        await system.spawn(drafter)
        await verifier.send("draft-ngram", _track(p.DraftMode.DECOUPLED, lookahead))
        batches = await _batches(verifier)
    assert drafter.stats["rounds"] == 5  # 4 + 4 + 4 + 4 + 1
    drafts = [d for batch in batches for d in batch]
    assert sum((d.tokens for d in drafts), []) == SEGMENT[4:4 + lookahead]
    if coalesce_s:
        assert [[(d.start, len(d.tokens)) for d in batch] for batch in batches] == [[(0, lookahead)]]
    else:
        assert [[len(d.tokens) for d in batch] for batch in batches] == [[4], [4], [4], [4], [1]]


async def test_a_coupled_request_drafts_at_most_the_window_and_waits() -> None:
    async with ActorSystem("inproc") as system:
        verifier = await _start(system)
        await verifier.send("draft-ngram", _track(p.DraftMode.COUPLED, decoupled_lookahead(WINDOW)))
        drafts = await _drafts(verifier)
    assert [(d.start, d.tokens) for d in drafts] == [(0, SEGMENT[4:4 + WINDOW])]


async def _until(condition, timeout_s: float = 60.0) -> float:
    """Wait until ``condition()`` holds; the seconds it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not condition():
        assert loop.time() - start < timeout_s, "timed out"
        await asyncio.sleep(0.02)
    return loop.time() - start


def _cycle(offset: int, n: int = 60) -> list[int]:
    return [300 + (offset + i) % 7 for i in range(n)]


async def _start_learned(system: ActorSystem, checkpoint, policy: str | None = None,
                         **options) -> tuple[Collector, DraftActor]:
    """A learned draft actor on the tiny checkpoint (1 layer, 64-token head) and a verifier stand-in."""
    verifier = Collector("verifier")
    await system.spawn(verifier)
    actor = DraftActor("draft-learned", "learned", verifier="verifier", model=str(checkpoint), policy=policy,
                       drafter_options={"layers": 1, "vocab": 64, "max_train_s": None, **options})
    await system.spawn(actor)
    await _until(lambda: actor.drafter is not None)
    return verifier, actor


async def test_a_learned_drafter_trains_when_the_verifier_goes_idle_and_not_before(tiny_checkpoint) -> None:
    """Rollouts sent while requests still run are kept; the batch sent as the verifier runs out of
    requests (the end of an RL step's rollout) starts a training round, with no weight update."""
    async with ActorSystem("inproc") as system:
        verifier, actor = await _start_learned(system, tiny_checkpoint, epochs=2)
        await verifier.send("draft-learned", p.Rollouts(prompts=[[1, 2, 3]] * 3, outputs=[_cycle(i) for i in range(3)]))
        await asyncio.sleep(0.5)
        assert actor.stats["trained"] == 0 and len(actor.drafter.buffer) == 3
        await verifier.send("draft-learned", p.Rollouts(prompts=[[1, 2, 4]], outputs=[_cycle(3)], idle=True))
        await _until(lambda: actor.stats["trained"] == 1)
        assert actor.drafter.trained and not actor.drafter.has_new_rollouts


@pytest.mark.parametrize("how", ["its own Track", "the verifier busy again"])
async def test_a_request_arriving_cuts_idle_training_short_and_is_then_drafted_for(tiny_checkpoint, how) -> None:
    """A Track for it, or the verifier saying it admitted requests again (another drafter's, or
    none: an unready learned drafter is tracked for nothing)."""
    async with ActorSystem("inproc") as system:
        verifier, actor = await _start_learned(system, tiny_checkpoint, epochs=100_000, max_train_s=120.0)
        await verifier.send("draft-learned", p.Rollouts(prompts=[[1, 2, 3]] * 4, outputs=[_cycle(i) for i in range(4)],
                                                        idle=True))
        await _until(lambda: actor._busy)  # training on the worker thread
        if how == "the verifier busy again":
            await verifier.send("draft-learned", p.Rollouts(prompts=[], outputs=[], idle=False))
            took = await _until(lambda: not actor._busy, timeout_s=30)
            assert took < 10
        await verifier.send("draft-learned", p.Track(request_id="r", context_ids=[1, 2, 3] + _cycle(0, 10),
                                                     prompt_len=3, window=4, mode=p.DraftMode.DECOUPLED))
        took = await _until(lambda: "r" in actor.states, timeout_s=30)
        assert took < 10  # not the round's 120 s
        assert actor.stats["trained"] == 0 and not actor.drafter.trained and actor.drafter.has_new_rollouts


async def test_its_stats_say_whether_it_can_draft_yet_and_the_policy_hears_at_once(tiny_checkpoint) -> None:
    """The policy leaves a learned drafter out until these say it has trained; the drafter sends
    them unasked when it becomes ready, so that it joins the next plan, not the next poll's."""
    async with ActorSystem("inproc") as system:
        policy = Collector("policy")
        await system.spawn(policy)
        verifier, actor = await _start_learned(system, tiny_checkpoint, policy="policy", epochs=1)

        async def ready() -> int:
            await verifier.send("draft-learned", p.StatsRequest())
            while True:
                _, msg = await asyncio.wait_for(verifier.received.get(), 10)
                if isinstance(msg, p.StatsReply):
                    return msg.values["ready"]

        assert await ready() == 0
        await verifier.send("draft-learned", p.Rollouts(prompts=[[1, 2, 3]], outputs=[_cycle(0)], idle=True))
        await _until(lambda: actor.stats["trained"] == 1)
        _, pushed = await asyncio.wait_for(policy.received.get(), 10)
        assert isinstance(pushed, p.StatsReply) and pushed.values["ready"] == 1
        assert await ready() == 1


async def test_a_drafter_that_never_learns_is_always_ready() -> None:
    async with ActorSystem("inproc") as system:
        verifier = await _start(system)
        await verifier.send("draft-ngram", p.StatsRequest())
        _, reply = await asyncio.wait_for(verifier.received.get(), 10)
    assert isinstance(reply, p.StatsReply) and reply.values["ready"] == 1 and "draft_s" in reply.values


async def test_a_training_round_that_raises_leaves_the_actor_serving(tiny_checkpoint, monkeypatch) -> None:
    async with ActorSystem("inproc") as system:
        verifier, actor = await _start_learned(system, tiny_checkpoint, epochs=1)

        def broken(should_stop=None):
            raise RuntimeError("CUDA out of memory")

        monkeypatch.setattr(actor.drafter, "train", broken)
        await verifier.send("draft-learned", p.Rollouts(prompts=[[1, 2, 3]], outputs=[_cycle(0)], idle=True))
        await asyncio.sleep(0.5)
        await verifier.send("draft-learned", p.StatsRequest())
        _, reply = await asyncio.wait_for(verifier.received.get(), 10)
    assert isinstance(reply, p.StatsReply) and reply.values["ready"] == 0 and reply.values["trained"] == 0


async def test_a_coupled_request_s_draft_is_not_held_for_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its verifier waits for it: a round with a coupled request sends at once what is held, even
    where decoupled rounds would be held for a minute."""
    monkeypatch.setattr(NgramDrafter, "lookup", False)
    monkeypatch.setattr(actor_module, "COALESCE_S", 60.0)
    async with ActorSystem("inproc") as system:
        verifier = await _start(system, k=4)
        coupled = p.Track(request_id="c", context_ids=SEGMENT + SEGMENT[:4], prompt_len=len(SEGMENT) + 4,
                          window=WINDOW, mode=p.DraftMode.COUPLED)
        decoupled = p.Track(request_id="d", context_ids=SEGMENT + SEGMENT[:4], prompt_len=len(SEGMENT) + 4,
                            window=decoupled_lookahead(WINDOW), mode=p.DraftMode.DECOUPLED)
        await verifier.send("draft-ngram", coupled)
        await verifier.send("draft-ngram", decoupled)
        batches = await _batches(verifier)
    assert any(d.request_id == "c" for d in batches[0])
    assert len(batches) >= 2  # the decoupled lookahead's later rounds went together, after it
    assert sum((d.tokens for batch in batches for d in batch if d.request_id == "d"), []) == \
        SEGMENT[4:4 + decoupled_lookahead(WINDOW)]


def test_held_drafts_of_a_rolled_back_or_untracked_request_are_dropped() -> None:
    """They continue a lookahead the verdict contradicted: sent, the verifier would drop them, and a
    redraft that continued them would be dropped with them."""
    actor = DraftActor("draft-ngram", "ngram", k=4, window=WINDOW)
    actor.drafter = NgramDrafter()
    for rid in ("r", "s"):
        actor._track(p.Track(request_id=rid, context_ids=SEGMENT, prompt_len=len(SEGMENT), window=WINDOW,
                             mode=p.DraftMode.DECOUPLED))
        actor.states[rid].lookahead.extend([1, 2])
    actor._hold([p.Draft(request_id=rid, method="ngram", start=0, tokens=[1, 2]) for rid in ("r", "s")], 0.0, 0.0)
    actor._apply([p.Verdict(request_id="r", start=0, tokens=[1], accepted=1, drafted=1)])  # agrees: kept
    assert [d.request_id for d in actor._unsent] == ["r", "s"]
    actor._apply([p.Verdict(request_id="r", start=1, tokens=[9], accepted=0, drafted=1)])  # contradicts 2
    assert [d.request_id for d in actor._unsent] == ["s"]
    actor._untrack("s")
    assert actor._unsent == []


@pytest.mark.parametrize("lookup", [True, False])
async def test_a_lookup_drafter_is_charged_its_cpu_time_and_a_model_its_wall_time(
        monkeypatch: pytest.MonkeyPatch, lookup: bool) -> None:
    """On 2 shared cores a lookup of 0.3 ms waited up to 14 ms for a core while the verifier's
    forward ran, and that wait, charged as drafting time, priced ngram too dear to shadow-score. A
    lookup's cost is its own CPU time; a model drafter's is its wall time (its torch threads are
    not the calling thread's, and it can outlast a step). Here every proposal waits 50 ms."""
    import time

    real = NgramDrafter.propose

    def waiting(self, states, k):
        time.sleep(0.05)
        return real(self, states, k)

    monkeypatch.setattr(NgramDrafter, "lookup", lookup)
    monkeypatch.setattr(NgramDrafter, "propose", waiting)
    drafter, drafts = await _one_decoupled_request()
    rounds, charged = drafter.stats["rounds"], drafter.stats["draft_s"]
    assert drafts and rounds >= 1
    if lookup:
        assert charged < 0.01 * rounds, charged
    else:
        assert charged >= 0.05 * rounds, charged
    assert sum(d.draft_ns for d in drafts) / 1e9 == pytest.approx(charged, rel=1e-6, abs=1e-9)


def _parking_actor(method: str) -> DraftActor:
    from specactor.drafters.registry import make_drafter

    actor = DraftActor(f"draft-{method}", method, k=4, window=WINDOW)
    actor.drafter = make_drafter(method)
    return actor


def _track_at(rid: str, output: list[int], prompt: list[int] = SEGMENT) -> p.Track:
    return p.Track(request_id=rid, context_ids=prompt + output, prompt_len=len(prompt), window=WINDOW,
                   mode=p.DraftMode.DECOUPLED)


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_a_parked_request_tracked_again_catches_up_and_drafts_as_one_tracked_afresh(
        monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """A shadow-scored request is untracked and tracked again every few periods; each Track indexed
    its whole context again. Parked, it only indexes what was committed meanwhile, and its drafts
    are those of a drafter that indexed it all."""
    parked, fresh = _parking_actor(method), _parking_actor(method)
    output = SEGMENT[:10]
    parked._track(_track_at("r", output))
    parked._untrack("r", park=True)
    assert "r" not in parked.states and parked._stats_reply().values["parked"] == 1
    starts = []
    monkeypatch.setattr(type(parked.drafter), "start", lambda self, state: starts.append(state.request_id))
    later = output + SEGMENT[10:25]
    parked._track(_track_at("r", later))
    assert starts == [] and parked.states["r"].committed == later
    monkeypatch.undo()
    fresh._track(_track_at("r", later))
    state, other = parked.states["r"], fresh.states["r"]
    assert parked._propose([state], WINDOW) == fresh._propose([other], WINDOW) != [[]]


def test_a_parked_request_whose_context_does_not_continue_it_starts_afresh() -> None:
    actor = _parking_actor("ngram")
    actor._track(_track_at("r", SEGMENT[:10]))
    actor._untrack("r", park=True)
    actor._track(_track_at("r", [7, 7, 7]))  # the same id, another text (a restarted request)
    assert actor.states["r"].committed == [7, 7, 7] and not actor._parked
    assert actor.drafter._index["r"].tokens == SEGMENT + [7, 7, 7]


def test_a_parked_request_that_finishes_leaves_its_whole_output_in_the_suffix_history() -> None:
    """The verifier's final verdict for a parked request starts at 0 and holds the whole output; a
    new sample of the prompt then drafts from where that output went after the park, and no partial
    copy went into the history at the park."""
    actor = _parking_actor("suffix")
    prompt, output = [1, 2, 3, 4, 5, 6], SEGMENT[:30]
    actor._track(_track_at("r", output[:10], prompt))
    actor._untrack("r", park=True)
    assert not actor.drafter._groups[next(iter(actor.drafter._groups))].history
    actor._apply([p.Verdict(request_id="r", start=0, tokens=output, accepted=0, drafted=0, finished=True)])
    assert not actor._parked
    actor._track(_track_at("s", output[:20], prompt))
    (draft,) = actor._propose([actor.states["s"]], 4)
    assert draft == output[20:24]


def test_parked_requests_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parking keeps memory: past PARKED_TOKENS the oldest parked request is finished, as an untracked
    one always was."""
    monkeypatch.setattr(actor_module, "PARKED_TOKENS", 2 * (len(SEGMENT) + 10))
    actor = _parking_actor("ngram")
    for rid in ("a", "b", "c"):
        actor._track(_track_at(rid, SEGMENT[:10]))
        actor._untrack(rid, park=True)
    assert list(actor._parked) == ["b", "c"] and set(actor.drafter._index) == {"b", "c"}
    actor._untrack("b")  # for good (an aborted request): finished
    assert list(actor._parked) == ["c"] and set(actor.drafter._index) == {"c"}


def test_a_model_copy_keeps_a_parked_requests_cache_until_its_slots_are_wanted() -> None:
    """Turned off and on again by the policy, a request is not fed to the copy again from its
    prompt; a new request that finds every slot taken takes the oldest parked one's."""
    from specactor.drafters.model import ModelDrafter
    from tests.conftest import ours_from_hf, tiny_hf_model

    actor = DraftActor("draft-model", "model", k=4, window=WINDOW)
    actor.drafter = drafter = ModelDrafter(ours_from_hf(tiny_hf_model("llama", seed=5)), max_slots=2, max_len=128)
    prompt = [(7 * i) % 200 + 1 for i in range(20)]
    actor._track(_track_at("a", [3, 4], prompt))
    actor._propose([actor.states["a"]], 4)
    actor._untrack("a", park=True)
    assert list(actor._parked) == ["a"] and "a" in drafter._slot  # its cache kept
    actor._track(_track_at("b", [5], prompt))
    actor._track(_track_at("c", [6], prompt))  # both slots were taken: "a" gives its up
    assert not actor._parked and set(drafter._slot) == {"b", "c"}


async def test_a_copy_that_cannot_feed_a_context_apart_still_drafts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model copy feeds a new decoupled request's context before it drafts; should that fail, the
    drafter goes on (the proposal feeds it, failing, if at all, for that request alone)."""
    monkeypatch.setattr(NgramDrafter, "lookup", False)
    monkeypatch.setattr(NgramDrafter, "cold", lambda self, state: 1000, raising=False)

    def refuse(self, states) -> None:
        raise ValueError("no room to feed")

    monkeypatch.setattr(NgramDrafter, "prefill", refuse, raising=False)
    drafter, drafts = await _one_decoupled_request()
    assert drafts and drafts[0].tokens[:4] == SEGMENT[4:8]
    assert drafter._fed_apart == {"r"}
