"""Structured events: JSON lines to a file, readable lines on a terminal.

Every event carries ``ts`` (unix seconds), ``event`` (a name from
:data:`CATALOGUE`), ``actor`` and ``pid``; per-request events bind
``request_id``; the events of a pool's replica carry ``replica`` (its index).
Several processes may append to one file: each event is one
``write`` of one line to a file opened with O_APPEND, so lines never interleave.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

import msgspec
import structlog

#: Every event name the package emits, with what it means and its fields
#: beyond ts/event/actor/pid/level. ``docs/events.md`` is generated from this.
CATALOGUE: dict[str, tuple[str, tuple[str, ...]]] = {
    "actor.started": ("An actor's inbox is bound and it is serving.", ("address",)),
    "actor.stopped": ("An actor drained its inbox and exited.", ("handled", "reason")),
    "actor.drain_timeout": (
        "Shutdown gave up waiting for Goodbye from some peers.",
        ("missing",),
    ),
    "actor.handler_failed": (
        "A handler raised; the actor replied with an error and goes on.",
        ("sender", "kind", "error"),
    ),
    "actor.bad_message": (
        "A frame was rejected (malformed, unknown kind, wrong fields, oversized).",
        ("sender", "error", "size"),
    ),
    "actor.error_reply": (
        "A peer answered something this actor sent with an Error; logged, never answered.",
        ("sender", "code", "error", "ref"),
    ),
    "actor.loop_failed": (
        "One of the actor's loops (step, drafting) raised: the actor stops and fails, so that its "
        "supervisor sees it crash instead of a process that answers heartbeats and does nothing.",
        ("error",),
    ),
    "actor.unknown_peer": ("A send named a peer missing from the directory.", ("peer",)),
    "actor.send_dropped": ("A message to a stopped or dead peer was dropped.", ("peer", "kind")),
    "system.spawned": ("The supervisor started an actor.", ("name", "process", "address")),
    "system.actor_crashed": (
        "An actor's process exited unexpectedly.",
        ("name", "returncode", "error"),
    ),
    "system.actor_restarted": (
        "The supervisor started a crashed or hung child actor again, under the same name.",
        ("name", "restarts", "address"),
    ),
    "system.actor_hung": (
        "An actor sent no heartbeat within the timeout.",
        ("name", "silent_for_s"),
    ),
    "system.shutdown": ("The supervisor stopped every actor.", ("actors", "seconds")),
    "verify.step": (
        "One verification step of the VerifyActor (methods: name -> [drafted, accepted, drafts] verified; "
        "shadowed: the same for the drafts of requests that were off but shadow-scored, checked against the "
        "tokens committed since they were stored (the step's, and for a draft that arrived late the ones "
        "before) and not verified; graph: the "
        "CUDA graph's batch x chunk the padded step replayed, empty when the step ran eagerly; forward_ms: "
        "the forward as the device ran it, on a GPU timed by CUDA events; step_ms: the whole step).",
        ("step", "batch_size", "prefill_tokens", "drafted", "accepted", "new_tokens", "forward_ms", "step_ms",
         "waited_ms", "methods", "shadowed", "graph"),
    ),
    "verify.graph_captured": (
        "The verifier captured a CUDA graph for a new step shape (inside that step's step_ms).",
        ("batch", "chunk", "capture_ms"),
    ),
    "verify.graphs_captured": (
        "The verifier captured the CUDA graphs of every step shape before serving (on a GPU), then "
        "served two throwaway requests so that the eager prefill's first-use costs fall before serving too.",
        ("shapes", "seconds", "warm_up_s"),
    ),
    "verify.weights": (
        "The verifier applied (ok) or rejected a weight update; held: requests that waited for it.",
        ("version", "update_id", "ok", "error", "held"),
    ),
    "draft.chunk": ("One DraftBatch a DraftActor sent: the drafts of its rounds that followed each other within "
                    "1 ms (a request's contiguous pieces as one draft); draft_ms is their drafting time.",
                    ("method", "requests", "tokens", "draft_ms")),
    "draft.trained": (
        "A learned drafter distilled itself on the rollouts: idle, when the verifier ran out of requests (an "
        "RL step's rollout ended); otherwise at a weight update. interrupted: a request came first, not swapped "
        "in (loss: first and last tenth).",
        ("method", "version", "idle", "sequences", "tokens", "epochs", "seconds", "loss_first", "loss_last", "vocab",
         "interrupted"),
    ),
    "draft.profiled": (
        "A model drafter measured what a proposal costs at each batch size (none was cached for this drafter, "
        "quantisation, threads and CPU): milliseconds a round giving each row one token, by batch size, and under "
        "0 the milliseconds a context token its first proposal feeds; cached at `path`.",
        ("path", "seconds", "ms_by_batch"),
    ),
    "draft.failed": ("A drafter raised on a request; it goes on without that drafter's drafts.",
                     ("method", "request_id", "error")),
    "policy.ready": (
        "A drafter became ready to draft (a learned drafter after its first training round) or stopped "
        "being ready; the policy assigns no request to one that is not.",
        ("method", "ready"),
    ),
    "policy.assign": (
        "The policy changed a request's drafting: methods (several = racing; none = speculation off), window, "
        "mode, and why.",
        ("request_id", "step", "methods", "window", "mode", "reason"),
    ),
    "policy.default": ("The policy's choice for requests yet to arrive.", ("methods", "window", "reason")),
    "policy.plan_gap": (
        "The policy now plans every this many verify steps (at least its plan_every), so that planning takes at "
        "most a quarter of the time between plans: a plan's CPU time and a step's forward time (a GPU step's "
        "sampler and bookkeeping are not in it), in milliseconds.",
        ("steps", "plan_ms", "step_ms", "batch"),
    ),
    "policy.draft_cost": (
        "The policy prices a model drafter by the cost table it measured (milliseconds a proposal round giving each "
        "row one token, by batch size), from now on scaled by what the drafter reports.",
        ("method", "ms_by_batch"),
    ),
    "policy.profile": (
        "The cost profile the policy decides on: this machine's, measured now (seconds it took) or cached, "
        "or 'packaged' (no profile for this machine: the packaged one, corrected online).",
        ("path", "seconds", "cached"),
    ),
    "policy.profile_unusable": (
        "A cached cost profile could not be used (corrupt, or measured for another setting): it is measured again.",
        ("path", "error"),
    ),
    "policy.profile_skipped": (
        "vLLM's engine is too short (`max_len`, sized to the rollout's samples) to measure this machine's profile in: "
        "the policy starts from the packaged one, corrected online, and a later engine with room measures it.",
        ("error",),
    ),
    "coordinator.error_reply": ("An actor answered the coordinator with an error.", ("sender", "code", "error", "ref")),
    "coordinator.verifier_restarting": (
        "The verifier crashed or hung and the supervisor is starting a new one: requests wait for it.",
        ("reason", "waiting"),
    ),
    "coordinator.verifier_recovered": (
        "A restarted verifier got the running weights and every waiting request again, resumed from the "
        "tokens the last one had committed (reported about once a second) or from its prompt: position-keyed "
        "sampling makes the output token-identical; or it could not (ok false: all fail).",
        ("ok", "error", "requests", "resumed", "resumed_tokens", "seconds"),
    ),
    "request.resumed": (
        "The verifier took a request that a verifier before it had partly generated: it goes on from there.",
        ("request_id", "tokens"),
    ),
    "request.finished": (
        "A request produced its result (verify steps, drafted and accepted tokens: speculative modes).",
        ("request_id", "tokens", "finish_reason", "latency_s", "steps", "drafted", "accepted"),
    ),
    "server.ready": ("The daemon is bound and serving.", ("endpoint", "model", "mode")),
    "server.call_failed": ("A client's call was refused; the client got this error.", ("call_id", "error")),
    "server.client_gone": ("A client vanished (silent, or a reply undeliverable); its requests were aborted.",
                           ("why", "aborted")),
    "server.pause_released": ("The client that paused the daemon vanished: the daemon resumed by itself.",
                              ("why",)),
    "server.draining": ("SIGTERM/SIGINT: new calls are refused, running requests may finish.",
                        ("in_flight", "drain_timeout_s")),
    "server.shutdown": ("The daemon stopped; every accepted request got its result.", ("calls", "in_flight", "aborted")),
    "pool.started": ("A RolloutPool placed its replicas and started their engines.",
                     ("replicas", "resources", "strategy", "nodes", "seconds")),
    "pool.dispatched": ("The pool sent samples to a replica (groups whole; resumed ones continue from their "
                        "committed tokens).", ("replica", "requests", "groups", "resumed", "resumed_tokens")),
    "pool.rebalanced": ("A replica had nothing to do: half of the busiest one's samples continue there from "
                        "their committed tokens (same tokens).", ("source", "target", "requests", "left")),
    "pool.replica_failed": ("A replica died, hung or refused an update the others took: Ray restarts it and "
                            "its samples move to a live replica.", ("replica", "error", "restarts", "in_flight")),
    "pool.rerouted": ("A dead replica's unfinished samples were sent to live ones.",
                      ("replica", "requests", "resumed")),
    "pool.replica_hung": ("A replica did not answer a ping in time: it is killed and treated as dead.",
                          ("replica", "silent_for_s")),
    "pool.replica_restored": ("A restarted replica loaded the running weights and serves again.",
                              ("replica", "version", "pid", "seconds")),
    "pool.replica_down": ("A replica is given up (restarts spent, or it could not start again).",
                          ("replica", "error", "restarts")),
    "pool.weights_updated": ("Every live replica loaded a weight update from the object store (or a path).",
                             ("version", "replicas", "path", "chunks", "seconds")),
    "rollout.summary": (
        "End of a rollout.",
        ("mode", "samples", "output_tokens", "wall_s", "tokens_per_s", "steps", "verifier_threads",
         "verifier_dtype", "device", "dtype", "kv_cache_mb"),
    ),
}


class EventSink:
    """structlog logger that tees an event dict to a JSON-lines file and a console."""

    def __init__(self, fd: int | None, console: TextIO | None, console_level: int) -> None:
        self._fd = fd
        self._console = console
        self._console_level = console_level
        self._encoder = msgspec.json.Encoder(enc_hook=str)
        self._renderer = structlog.dev.ConsoleRenderer(
            colors=bool(console is not None and console.isatty())
        )

    def _emit(self, level: int, event: dict[str, Any]) -> None:
        if self._fd is not None:
            os.write(self._fd, self._encoder.encode(event) + b"\n")
        if self._console is not None and level >= self._console_level:
            shown = {k: v for k, v in event.items() if k not in ("pid", "ts")}
            self._console.write(self._renderer(None, "", shown) + "\n")
            self._console.flush()

    def debug(self, **event: Any) -> None:
        self._emit(10, event)

    def info(self, **event: Any) -> None:
        self._emit(20, event)

    def warning(self, **event: Any) -> None:
        self._emit(30, event)

    def error(self, **event: Any) -> None:
        self._emit(40, event)

    def critical(self, **event: Any) -> None:
        self._emit(50, event)

    msg = info
    exception = error


_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
_configured: dict[str, Any] = {}


#: set in a pool's replica process (and so in its actors' processes): every event it writes names it
REPLICA_ENV = "SPECACTOR_REPLICA"


def _add_meta(_: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    event["ts"] = time.time()
    event["level"] = method
    event.setdefault("pid", os.getpid())
    replica = _configured.get("replica")
    if replica is not None:
        event.setdefault("replica", replica)
    return event


def configure_events(
    path: str | os.PathLike[str] | None = None,
    console_level: str | None = "warning",
    file_level: str = "info",
) -> None:
    """Route events to ``path`` (JSON lines, appended) and/or the console.

    ``console_level=None`` silences the console. Safe to call again: the last
    call wins (the previous file is closed).
    """
    previous = _configured.pop("fd", None)
    if previous is not None:
        os.close(previous)
    fd = None
    if path is not None:
        fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    replica = os.environ.get(REPLICA_ENV, "")
    _configured.update(fd=fd, path=None if path is None else os.fspath(path),
                       replica=int(replica) if replica.isdigit() else None)
    console = sys.stderr if console_level is not None else None
    if fd is None and console is None:
        min_level = 50
    else:
        levels = [_LEVELS[file_level]] if fd is not None else []
        if console_level is not None:
            levels.append(_LEVELS[console_level])
        min_level = min(levels)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _add_meta,
            structlog.processors.format_exc_info,
            lambda _l, _m, ev: ev,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(min_level),
        logger_factory=lambda *_: EventSink(fd, console, _LEVELS.get(console_level or "critical", 50)),
        cache_logger_on_first_use=False,
    )


def events_path() -> str | None:
    """The file events currently go to (passed on to child processes)."""
    return _configured.get("path")


def get_logger(**bound: Any) -> structlog.typing.FilteringBoundLogger:
    """A logger with ``bound`` fields (e.g. ``actor=name``) on every event."""
    return structlog.get_logger().bind(**bound)


def catalogue_markdown() -> str:
    """The event catalogue as a markdown table (docs/events.md is this)."""
    lines = [
        "# Event catalogue",
        "",
        "Generated from `specactor.events.CATALOGUE` (`specactor events catalogue`).",
        "Every event also carries `ts` (unix seconds), `event`, `level`, `actor` and `pid`;",
        "per-request events carry `request_id`; the events of a pool's replica (`RolloutPool`) carry",
        "`replica`, its index.",
        "",
        "| event | meaning | fields |",
        "|---|---|---|",
    ]
    for name, (meaning, fields) in CATALOGUE.items():
        lines.append(f"| `{name}` | {meaning} | {', '.join(f'`{f}`' for f in fields)} |")
    return "\n".join(lines) + "\n"


# Quiet by default until the application configures events.
configure_events(None, console_level="warning")
