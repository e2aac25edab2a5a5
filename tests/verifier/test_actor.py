"""VerifyActor's verdicts to the policy (every step's, in order; quiet steps together) and to the
drafters (every step's while a request speculates; a shadow-scored one's every SHADOW_STRIDE steps)."""

from __future__ import annotations

import asyncio
from typing import Any

from specactor import protocol as p
from specactor.actor import ActorSystem
from specactor.actor.probes import Collector
from specactor.drafters.actor import DraftActor
from specactor.verifier.actor import VerifyActor
from specactor.verifier.verdict_fanout import POLICY_QUIET_STEPS


class _RecordingVerifier(VerifyActor):
    """Notes, for every VerdictBatch it sends the policy, how many steps it had made by then."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent_at: list[tuple[int, int]] = []  # (the batch's step, steps made when it was sent)

    async def send(self, peer: str, msg: p._Msg, **kwargs: Any) -> bool:
        if peer == self.policy and isinstance(msg, p.VerdictBatch):
            self.sent_at.append((msg.step, int(self.stats["steps"])))
        return await super().send(peer, msg, **kwargs)


async def _rollout(tiny_checkpoint, assignment: p.Assignment | None) -> tuple[
        _RecordingVerifier, list[p.VerdictBatch], dict[str, p.RequestResult]]:
    async with ActorSystem("inproc") as system:
        policy, client = Collector("policy"), Collector("client")
        await system.spawn(policy)
        await system.spawn(client)
        if assignment is not None:
            await system.spawn(DraftActor("draft-ngram", "ngram", verifier="verifier"))
        verifier = _RecordingVerifier("verifier", model=str(tiny_checkpoint), policy="policy", max_batch=4,
                                      max_len=256)
        await system.spawn(verifier)
        if assignment is not None:
            await policy.send("verifier", p.AssignmentBatch(assignments=[assignment]))
        params = p.SamplingParams(temperature=1.0, max_tokens=60, seed=5)
        for i in range(2):
            await client.send("verifier", p.GenerateRequest(request_id=f"r{i}", prompt_ids=[1, 5, 9, 13 + i] * 3,
                                                            params=params, reply_to="client"))
        results: dict[str, p.RequestResult] = {}
        while len(results) < 2:
            _, msg = await asyncio.wait_for(client.received.get(), 60)
            if isinstance(msg, p.RequestResult):
                results[msg.request_id] = msg
        batches: list[p.VerdictBatch] = []
        while True:
            try:
                _, msg = await asyncio.wait_for(policy.received.get(), 0.5)
            except asyncio.TimeoutError:
                break
            if isinstance(msg, p.VerdictBatch):
                batches.append(msg)
    return verifier, batches, results


def _assert_every_step_in_order(verifier: _RecordingVerifier, batches: list[p.VerdictBatch],
                                results: dict[str, p.RequestResult]) -> None:
    assert [b.step for b in batches] == list(range(1, int(verifier.stats["steps"]) + 1))
    for rid, result in results.items():
        verdicts = [v for b in batches for v in b.verdicts if v.request_id == rid]
        assert [t for v in verdicts for t in v.tokens] == result.token_ids
        assert verdicts[-1].finished and not any(v.finished for v in verdicts[:-1])


async def test_quiet_steps_reach_the_policy_together_and_every_step_arrives_in_order(tiny_checkpoint) -> None:
    """Nothing drafts: the policy learns nothing urgent from a step, and a message a step would
    wake its process (the caller's) on the verifier's cores every step."""
    verifier, batches, results = await _rollout(tiny_checkpoint, assignment=None)
    _assert_every_step_in_order(verifier, batches, results)
    steps = int(verifier.stats["steps"])
    assert steps >= 3 * POLICY_QUIET_STEPS
    sends = {made for _, made in verifier.sent_at}
    # the prefill step and the finishing steps go at once; the rest wait for POLICY_QUIET_STEPS of them
    assert len(sends) <= steps // POLICY_QUIET_STEPS + 4
    assert all(made - step < POLICY_QUIET_STEPS for step, made in verifier.sent_at)


async def test_shadow_scores_alone_reach_the_policy_with_the_quiet_steps(tiny_checkpoint) -> None:
    """A request that is only scored (window 0) speculates nothing: its scores wait with the
    quiet steps, so the caller's process is not woken on every step of a tail it shadows."""
    verifier, batches, results = await _rollout(tiny_checkpoint, p.Assignment(
        request_id="*", methods=["ngram"], window=0, mode=p.DraftMode.DECOUPLED))
    _assert_every_step_in_order(verifier, batches, results)
    steps = int(verifier.stats["steps"])  # the ngram drafter tracks both requests all along
    assert steps >= 3 * POLICY_QUIET_STEPS
    assert len({made for _, made in verifier.sent_at}) <= steps // POLICY_QUIET_STEPS + 4
    assert all(made - step < POLICY_QUIET_STEPS for step, made in verifier.sent_at)


async def test_while_a_request_drafts_the_policy_gets_every_step_at_once(tiny_checkpoint) -> None:
    verifier, batches, results = await _rollout(tiny_checkpoint, p.Assignment(
        request_id="*", methods=["ngram"], window=4, mode=p.DraftMode.DECOUPLED))
    _assert_every_step_in_order(verifier, batches, results)
    assert all(made == step for step, made in verifier.sent_at)


async def test_a_shadow_scored_request_is_drafted_a_stride_ahead_and_a_speculating_one_the_full_lookahead(
        tiny_checkpoint) -> None:
    """Window 0 (the policy scores a free method's drafts for a request it keeps off): a step
    checks one drafted token, so a long lookahead would mostly be thrown away and drafted again;
    the drafter hears of it every SHADOW_STRIDE steps, so its draft covers those."""
    from specactor.speculation import decoupled_lookahead, shadow_lookahead

    async with ActorSystem("inproc") as system:
        policy, client, drafter = Collector("policy"), Collector("client"), Collector("draft-ngram")
        for actor in (policy, client, drafter):
            await system.spawn(actor)
        await system.spawn(VerifyActor("verifier", model=str(tiny_checkpoint), policy="policy", window=16,
                                       max_batch=2, max_len=512))

        async def tracked() -> list[p.Message]:
            out = []
            while not out or not isinstance(out[-1], p.Track):
                _, msg = await asyncio.wait_for(drafter.received.get(), 30)
                if isinstance(msg, (p.Track, p.Untrack)):
                    out.append(msg)
            return out

        def assign(rid: str, window: int) -> p.AssignmentBatch:
            return p.AssignmentBatch(assignments=[p.Assignment(request_id=rid, methods=["ngram"], window=window,
                                                               mode=p.DraftMode.DECOUPLED)])

        await policy.send("verifier", assign("*", 0))
        await client.send("verifier", p.GenerateRequest(
            request_id="r", prompt_ids=[1, 5, 9, 13] * 3, params=p.SamplingParams(max_tokens=400, seed=1),
            reply_to="client"))
        first = await tracked()
        assert [type(m) for m in first] == [p.Track] and first[0].window == shadow_lookahead()
        await policy.send("verifier", assign("r", 4))
        on = await tracked()
        assert [type(m) for m in on] == [p.Untrack, p.Track] and on[1].window == decoupled_lookahead(16)
        assert len(on[1].context_ids) > len(first[0].context_ids)  # from what is committed by then
        await policy.send("verifier", assign("r", 0))
        off = await tracked()
        assert [type(m) for m in off] == [p.Untrack, p.Track] and off[1].window == shadow_lookahead()


async def _one_request(system: ActorSystem, tiny_checkpoint, window: int, max_tokens: int, seed: int,
                       mode: p.DraftMode = p.DraftMode.DECOUPLED) -> tuple[Collector, Collector, Collector]:
    """A verifier whose policy, client and ngram drafter are Collectors, running request "r" with
    ``window`` and ``mode`` for every request; returns (policy, client, drafter)."""
    policy, client, drafter = Collector("policy"), Collector("client"), Collector("draft-ngram")
    for actor in (policy, client, drafter):
        await system.spawn(actor)
    await system.spawn(VerifyActor("verifier", model=str(tiny_checkpoint), policy="policy", max_batch=2,
                                   max_len=256, barrier_timeout_s=0.05))  # coupled: the drafter never answers
    await policy.send("verifier", p.AssignmentBatch(assignments=[p.Assignment(
        request_id="*", methods=["ngram"], window=window, mode=mode)]))
    await client.send("verifier", p.GenerateRequest(
        request_id="r", prompt_ids=[1, 5, 9, 13] * 3, params=p.SamplingParams(max_tokens=max_tokens, seed=seed),
        reply_to="client"))
    return policy, client, drafter


async def _drafter_sees(tiny_checkpoint, window: int,
                        mode: p.DraftMode) -> tuple[list[p.Message], p.RequestResult]:
    """Everything a (silent) ngram drafter is sent while one request runs with ``window``."""
    async with ActorSystem("inproc") as system:
        _, client, drafter = await _one_request(system, tiny_checkpoint, window, max_tokens=41, seed=2, mode=mode)
        _, result = await asyncio.wait_for(client.received.get(), 60)
        assert isinstance(result, p.RequestResult)
        seen: list[p.Message] = []
        while True:
            try:
                seen.append((await asyncio.wait_for(drafter.received.get(), 0.5))[1])
            except asyncio.TimeoutError:
                return seen, result


async def test_a_drafter_drafting_only_for_shadowed_requests_hears_every_stride_of_steps_in_one_batch(
        tiny_checkpoint) -> None:
    """Each drafting round costs the caller's CPU, which on 2 cores the verifier's forward pays:
    for a request that is only scored, the drafter gets SHADOW_STRIDE steps' verdicts at a time,
    all of them, in order, the last one as soon as the request finishes. A speculating request's
    drafter hears of every step at once, and so does a coupled one's (its step waits for the draft)."""
    from specactor.speculation import SHADOW_STRIDE

    decoupled, coupled = p.DraftMode.DECOUPLED, p.DraftMode.COUPLED
    for window, mode, most in ((0, decoupled, SHADOW_STRIDE), (4, decoupled, 1), (0, coupled, 1)):
        seen, result = await _drafter_sees(tiny_checkpoint, window, mode)
        batches = [m for m in seen if isinstance(m, p.VerdictBatch)]
        verdicts = [v for b in batches for v in b.verdicts]
        assert [t for v in verdicts for t in v.tokens] == result.token_ids[1:]  # after the prefill's
        assert all(a.start + len(a.tokens) == b.start for a, b in zip(verdicts, verdicts[1:]))
        assert verdicts[-1].finished and batches[-1].verdicts[-1] is verdicts[-1]
        assert max(len(b.verdicts) for b in batches) == most
        assert len(batches) <= len(verdicts) // most + 2  # released at steps divisible by the stride


async def test_learners_get_each_finished_sample_and_the_last_batch_says_the_verifier_is_idle(tiny_checkpoint) -> None:
    """A learned drafter trains when the verifier runs out of requests; until the last sample
    finishes, Rollouts say there is still work."""
    async with ActorSystem("inproc") as system:
        learner, client = Collector("draft-learned"), Collector("client")
        await system.spawn(learner)
        await system.spawn(client)
        await system.spawn(VerifyActor("verifier", model=str(tiny_checkpoint), learners=["draft-learned"],
                                       max_batch=4, max_len=256))
        for i, n in enumerate((5, 30)):
            params = p.SamplingParams(temperature=0.0, max_tokens=n)
            await client.send("verifier", p.GenerateRequest(request_id=f"r{i}", prompt_ids=[1, 5, 9, 13 + i],
                                                            params=params, reply_to="client"))
        results = {}
        while len(results) < 2:
            _, msg = await asyncio.wait_for(client.received.get(), 60)
            if isinstance(msg, p.RequestResult):
                results[msg.request_id] = msg
        rollouts = []
        while len(rollouts) < 2:
            _, msg = await asyncio.wait_for(learner.received.get(), 10)
            if isinstance(msg, p.Rollouts):
                rollouts.append(msg)
        # a request after an idle batch: learners hear at once that a rollout began (stop training)
        await client.send("verifier", p.GenerateRequest(request_id="r2", prompt_ids=[1, 5, 9],
                                                        params=p.SamplingParams(temperature=0.0, max_tokens=3),
                                                        reply_to="client"))
        while len(rollouts) < 4:
            _, msg = await asyncio.wait_for(learner.received.get(), 30)
            if isinstance(msg, p.Rollouts):
                rollouts.append(msg)
    assert [(r.outputs, r.idle) for r in rollouts[:2]] == [([results["r0"].token_ids], False),
                                                           ([results["r1"].token_ids], True)]
    assert (rollouts[2].outputs, rollouts[2].idle) == ([], False)
    assert rollouts[3].idle and len(rollouts[3].outputs) == 1


def test_the_verifier_is_idle_with_the_policys_assignments_queued_but_not_with_a_request() -> None:
    """The policy answers the last verdicts with assignments: those must not hide the end of a rollout."""
    actor = VerifyActor("verifier", model="unused")
    assert actor._idle()
    assignment = p.Assignment(request_id="r0", methods=["ngram"], window=4, mode=p.DraftMode.DECOUPLED)
    actor._inbox.append(("policy", p.AssignmentBatch(assignments=[assignment])))
    assert actor._idle()
    actor._inbox.append(("client", p.GenerateRequest(request_id="r1", prompt_ids=[1, 2], params=p.SamplingParams(),
                                                     reply_to="client")))
    assert not actor._idle()


async def test_a_request_turned_off_is_parked_at_its_drafter_which_gets_its_whole_output_at_the_end(
        tiny_checkpoint) -> None:
    """Off for now is not finished: the drafter may keep a lookup's state for the next shadow period
    (Untrack.park), and when the request finishes without it, one verdict from position 0 brings it
    the whole output (a suffix drafter's history of the prompt would otherwise hold a partial copy)."""
    async with ActorSystem("inproc") as system:
        policy, client, drafter = await _one_request(system, tiny_checkpoint, window=4, max_tokens=80, seed=1)
        seen: list[p.Message] = []
        while not any(isinstance(m, p.VerdictBatch) for m in seen):
            seen.append((await asyncio.wait_for(drafter.received.get(), 30))[1])
        await policy.send("verifier", p.AssignmentBatch(assignments=[p.Assignment(
            request_id="r", methods=[], window=0, mode=p.DraftMode.DECOUPLED)]))
        _, result = await asyncio.wait_for(client.received.get(), 60)
        assert isinstance(result, p.RequestResult)
        while True:
            try:
                seen.append((await asyncio.wait_for(drafter.received.get(), 0.5))[1])
            except asyncio.TimeoutError:
                break
    untracks = [m for m in seen if isinstance(m, p.Untrack)]
    assert len(untracks) == 1 and untracks[0].park
    last = [v for m in seen[seen.index(untracks[0]):] if isinstance(m, p.VerdictBatch) for v in m.verdicts]
    assert len(last) == 1 and last[0].finished and last[0].start == 0 and last[0].tokens == result.token_ids
