"""Entry point of an actor's child process.

``python -m specactor.actor.child SPEC_JSON BIND_ADDRESS SUPERVISOR_ADDRESS [EVENTS]``
builds the actor from its :class:`ActorSpec`, serves it on uvloop when
available, and exits 0 after a clean stop.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import msgspec


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    from specactor.actor.spec import ActorSpec

    spec = msgspec.json.decode(argv[0].encode(), type=ActorSpec)
    os.environ.update(spec.env)
    bind, supervisor = argv[1], argv[2]

    from specactor.actor.spec import load_class
    from specactor.events import configure_events

    configure_events(argv[3] if len(argv) == 4 and argv[3] else None, console_level="warning")
    actor = load_class(spec.cls)(name=spec.name, **spec.kwargs)

    async def run() -> None:
        
        loop = asyncio.get_running_loop()
        # The supervisor decides when we stop; Ctrl-C on the terminal reaches
        # the whole process group, so children ignore it and wait for Stop.
        loop.add_signal_handler(signal.SIGINT, lambda: None)
        loop.add_signal_handler(signal.SIGTERM, lambda: actor.request_stop("SIGTERM"))
        import zmq

        ctx = zmq.Context()
        try:
            await actor.serve(bind, ctx, supervisor_address=supervisor)
        finally:
            ctx.term()

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
