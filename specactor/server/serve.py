"""The ``specactor serve`` process: engine start-up, signals, the ready line."""

from __future__ import annotations

import asyncio
import signal
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specactor.events import configure_events

if TYPE_CHECKING:
    from specactor.coordinator import EngineConfig

READY = "specactor serve: ready on"  # the line a supervisor (or a test) waits for


@dataclass
class ServeOptions:
    engine: "EngineConfig"
    endpoint: str = "tcp://127.0.0.1:5557"
    events: str | None = None
    client_timeout_s: float = 10.0
    drain_timeout_s: float = 30.0


async def _main(opts: ServeOptions) -> None:
    from specactor.coordinator import RolloutEngine
    from specactor.server.daemon import serve

    if opts.client_timeout_s <= 0 or opts.drain_timeout_s < 0:
        raise ValueError("--client-timeout must be > 0 and --drain-timeout >= 0")
    config = opts.engine
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with RolloutEngine(config) as engine:
        def ready(endpoint: str) -> None:
            print(f"{READY} {endpoint} (model {engine.model_name}, mode {config.mode}, "
                  f"drafters {','.join(config.active_drafters) or '-'})", flush=True)

        await serve(engine, opts.endpoint, client_timeout_s=opts.client_timeout_s,
                    drain_timeout_s=opts.drain_timeout_s, stop=stop, on_ready=ready)
    print("specactor serve: stopped", file=sys.stderr, flush=True)


def run_daemon(opts: ServeOptions) -> int:
    configure_events(opts.events, console_level="warning")
    asyncio.run(_main(opts))
    return 0
