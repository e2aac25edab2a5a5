"""Where a step's verdicts go: each drafter gets those of the requests it drafts for, the policy
all of them, learning drafters the finished samples, and every finished request its result.

The quiet parts wait and go together: verdicts of shadow-scored requests every SHADOW_STRIDE
steps, and steps the policy learns nothing urgent from up to POLICY_QUIET_STEPS at a time, so
that the drafters' and the policy's processes wake once for both (their CPU comes from the
cores the verifier computes on). :class:`VerdictFanout` is that half of the VerifyActor.
"""

from __future__ import annotations

from typing import Any

from specactor import protocol as p
from specactor.speculation import SHADOW_STRIDE

#: quiet steps (see VerdictFanout._quiet) whose verdicts the policy gets in one burst
POLICY_QUIET_STEPS = 8


class VerdictFanout:
    """Sends a step's verdicts and results on, for :class:`~specactor.verifier.actor.VerifyActor`,
    whose state (drafters per request, held verdicts, the policy, the learners) it reads."""

    async def _broadcast(self, report: Any) -> None:
        per_drafter: dict[str, list[p.Verdict]] = {}
        finished = {seq.request_id: seq for seq in report.finished}
        for verdict in report.verdicts:
            for drafter in self.drafters.get(verdict.request_id, []):
                per_drafter.setdefault(drafter, []).append(verdict)
            seq = finished.get(verdict.request_id) if verdict.finished else None
            for drafter in self._parked.get(verdict.request_id, ()) if seq is not None else ():
                per_drafter.setdefault(drafter, []).append(p.Verdict(  # parked there: the whole output
                    request_id=seq.request_id, start=0, tokens=list(seq.output_ids), accepted=0, drafted=0,
                    finished=True))
        step, step_ns = int(self.stats["steps"]), int(report.forward_s * 1e9)
        assert self.verifier is not None
        shadowed = self.verifier.is_shadowed
        for drafter, verdicts in per_drafter.items():
            self._drafter_held.setdefault(drafter, []).extend(verdicts)
            if step % SHADOW_STRIDE and all(shadowed(v.request_id) and not v.finished
                                            and v.request_id not in self.coupled for v in verdicts):
                continue  # only shadow-scored requests: told every SHADOW_STRIDE steps, with the policy's
                # quiet steps (a coupled one's step waits for its draft: it is told at once)
            await self._release_held(drafter, step, step_ns, report.batch_size)
        if self.policy is not None and report.verdicts and self.policy not in self.dead_peers:
            await self._to_policy(p.VerdictBatch(step=step, verdicts=report.verdicts, step_ns=step_ns,
                                                 batch_size=report.batch_size, waiting=report.waiting,
                                                 lent=self._lent_step))
        for seq in report.finished:
            await self._result(seq)
        done = [seq for seq in report.finished if seq.finish_reason in (p.FinishReason.STOP, p.FinishReason.LENGTH)] \
            if self.learners else []
        if done:
            rollouts = p.Rollouts(prompts=[seq.prompt_ids for seq in done], outputs=[seq.output_ids for seq in done],
                                  idle=self._idle())
            self._learners_told_idle = rollouts.idle
            await self._to_learners(rollouts)

    async def _release_held(self, drafter: str, step: int | None = None, step_ns: int = 0,
                            batch_size: int = 0) -> None:
        """Send ``drafter`` the verdicts held for it, one VerdictBatch (before a Track or Untrack: it
        must see them in the order they were committed)."""
        verdicts = self._drafter_held.pop(drafter, None)
        if verdicts:
            await self.send(drafter, p.VerdictBatch(step=int(self.stats["steps"]) if step is None else step,
                                                    verdicts=verdicts, step_ns=step_ns, batch_size=batch_size))

    async def _to_learners(self, rollouts: p.Rollouts) -> None:
        for learner in self.learners:
            if learner in self.directory and learner not in self.dead_peers:
                await self.send(learner, rollouts)

    def _idle(self) -> bool:
        """No request runs, waits for a slot or waits in the inbox: the rollout is over (the
        policy's assignments may still come in; they are not work)."""
        return not (self.verifier is not None and self.verifier.has_work) and not self._held \
            and not any(isinstance(msg, p.GenerateRequest) for _, msg in self._inbox)

    def _quiet(self, batch: p.VerdictBatch) -> bool:
        """A step the policy learns nothing urgent from: no request speculates, none arrived (its
        prefill) or finished; shadow scores may wait (a period needs several). While speculation does
        not pay, nearly every step is quiet, and a message a step wakes the policy's process, whose
        CPU comes from the cores the verifier computes on (2-4% of the makespan on 2 cores); quiet
        steps go with the shadow-scoring drafters' verdicts (SHADOW_STRIDE divides
        POLICY_QUIET_STEPS), so that process wakes once for both."""
        assert self.verifier is not None
        return not any(v.drafted or v.finished or v.start == 0
                       or (self.drafters.get(v.request_id) and not self.verifier.is_shadowed(v.request_id))
                       for v in batch.verdicts)

    async def _to_policy(self, batch: p.VerdictBatch) -> None:
        """Every step's verdicts reach the policy in order; quiet ones up to POLICY_QUIET_STEPS at a
        time. Advisory: a policy whose loop stops reading (it lives in the caller's process) must
        not stall verification; it plans on the next batch that gets through."""
        self._policy_held.append(batch)
        if self._quiet(batch) and batch.step % POLICY_QUIET_STEPS and len(self._policy_held) < POLICY_QUIET_STEPS:
            return
        held, self._policy_held = self._policy_held, []
        for one in held:
            if not await self.send(self.policy, one, timeout_s=0):
                self.stats["dropped_to_policy"] += 1  # what finished in it must still be forgotten there:
                self._policy_forget.extend(v.request_id for v in one.verdicts if v.finished)
        while self._policy_forget and await self.send(
                self.policy, p.Untrack(request_id=self._policy_forget[0]), timeout_s=0):
            self._policy_forget.pop(0)
