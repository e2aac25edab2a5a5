"""Entry point of an actor's child process.

``python -m specactor.actor.child SPEC_JSON BIND_ADDRESS SUPERVISOR_ADDRESS [EVENTS]``
builds the actor from its :class:`ActorSpec`, serves it on uvloop when
available, and exits 0 after a clean stop.

It dies with its parent: a parent killed with SIGKILL runs no cleanup, and a
verifier left behind would hold the model and its KV cache until someone
noticed. On Linux the kernel sends it SIGKILL when the parent goes
(``PR_SET_PDEATHSIG``; strictly, when the parent's thread that started it
exits, so start actors from a thread that lives as long as the engine);
everywhere, it checks once a second that its parent is still the one that
started it (``SPECACTOR_PARENT_PID``) and exits if not.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys

import msgspec

from specactor.actor.actor_spec import PARENT_ENV

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None) -> None:
    """Ask the kernel for SIGKILL when the parent dies (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if parent is not None and os.getppid() != parent:
        os._exit(1)  # the parent died before the request above took effect


async def watch_parent(parent: int, every_s: float = 1.0) -> None:
    """Exit the process when the parent is gone (reparented processes get another ppid)."""
    while True:
        await asyncio.sleep(every_s)
        if os.getppid() != parent:
            os._exit(1)


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    from specactor.actor.actor_spec import ActorSpec

    parent = int(os.environ[PARENT_ENV]) if os.environ.get(PARENT_ENV, "").isdigit() else None
    die_with_parent(parent)
    spec = msgspec.json.decode(argv[0].encode(), type=ActorSpec)
    os.environ.update(spec.env)
    bind, supervisor = argv[1], argv[2]

    from specactor.actor.actor_spec import load_class
    from specactor.events import configure_events

    configure_events(argv[3] if len(argv) == 4 and argv[3] else None, console_level="warning")
    actor = load_class(spec.cls)(name=spec.name, **spec.kwargs)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        watcher = asyncio.create_task(watch_parent(parent)) if parent is not None else None
        # The supervisor decides when we stop; Ctrl-C on the terminal reaches
        # the whole process group, so children ignore it and wait for Stop.
        loop.add_signal_handler(signal.SIGINT, lambda: None)
        loop.add_signal_handler(signal.SIGTERM, lambda: actor.request_stop("SIGTERM"))
        import zmq

        ctx = zmq.Context()
        try:
            await actor.serve(bind, ctx, supervisor_address=supervisor)
        finally:
            if watcher is not None:
                watcher.cancel()
            ctx.term()

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
