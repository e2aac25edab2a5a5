"""The ``specactor serve`` process: engine start-up, signals, the ready line."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specactor.events import configure_events

if TYPE_CHECKING:
    import subprocess

    from specactor.config import EngineConfig
    from specactor.server.security import ServerKeys, WeightPaths

READY = "specactor serve: ready on"  # the line a supervisor (or a test) waits for


@dataclass
class ServeOptions:
    engine: "EngineConfig"
    endpoint: str = "tcp://127.0.0.1:5557"
    client_timeout_s: float = 10.0
    drain_timeout_s: float = 30.0
    server_key: str | None = None  # the daemon's NAME.key_secret: serve only clients with a key
    client_keys: str | None = None  # the folder of the clients' NAME.key files
    insecure: bool = False  # listen beyond loopback with no keys
    weights_dirs: tuple[str, ...] = ()  # where update_weights(path=...) may read
    replicas: int | None = None  # serve from a RolloutPool of this many replicas (Ray)
    ray_address: str | None = None


def check_security(opts: ServeOptions) -> tuple["ServerKeys | None", "WeightPaths"]:
    """The daemon's (ServerKeys or None, WeightPaths) from its flags; ValueError naming what is
    wrong (a key without the other half, an unreadable file, a reachable endpoint with no key)."""
    from specactor.server.security import ServerKeys, WeightPaths, check_endpoint, is_loopback

    if (opts.server_key is None) != (opts.client_keys is None):
        raise ValueError("--server-key and --client-keys go together (the daemon's key pair and the folder of "
                         "the clients' public keys)")
    keys = None
    if opts.server_key is not None:
        keys = ServerKeys(Path(opts.server_key), Path(opts.client_keys or ""))
        keys.check()
    check_endpoint(opts.endpoint, keys, opts.insecure)
    for folder in opts.weights_dirs:
        if not os.path.isdir(folder):
            raise ValueError(f"--weights-dir {folder}: not a folder")
    return keys, WeightPaths(list(opts.weights_dirs), reachable=not is_loopback(opts.endpoint))


async def _main(opts: ServeOptions) -> None:
    from specactor.rollout_engine import RolloutEngine
    from specactor.server.daemon import serve

    if opts.client_timeout_s <= 0 or opts.drain_timeout_s < 0:
        raise ValueError("--client-timeout must be > 0 and --drain-timeout >= 0")
    keys, weight_paths = check_security(opts)  # before the model loads
    config = opts.engine
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if opts.replicas:
        from specactor.pool import RolloutPool

        runner: Any = RolloutPool(config, replicas=opts.replicas, ray_address=opts.ray_address)
    else:
        runner = RolloutEngine(config)
    async with runner as engine:
        for sig in (signal.SIGTERM, signal.SIGINT):  # again: starting Ray installs handlers of its own
            loop.add_signal_handler(sig, stop.set)

        def ready(endpoint: str) -> None:
            pool = f", {opts.replicas} replicas" if opts.replicas else ""
            print(f"{READY} {endpoint} (model {engine.model_name}, mode {config.mode}{pool}, "
                  f"drafters {','.join(config.active_drafters) or '-'}, {config.device} {config.dtype})", flush=True)

        await serve(engine, opts.endpoint, client_timeout_s=opts.client_timeout_s,
                    drain_timeout_s=opts.drain_timeout_s, stop=stop, on_ready=ready, keys=keys,
                    weight_paths=weight_paths)
    print("specactor serve: stopped", file=sys.stderr, flush=True)


def run_daemon(opts: ServeOptions) -> int:
    configure_events(opts.engine.events_path, console_level="warning")
    asyncio.run(_main(opts))
    return 0


class DaemonProcess:
    """A ``specactor serve`` child process: started on a free loopback port, ready when returned.

        daemon = DaemonProcess.start("--mode", "specactor")
        ... RolloutClient(daemon.endpoint) ...
        daemon.stop()   # SIGTERM: drains, delivers every result, exits 0
    """

    def __init__(self, proc: "subprocess.Popen[str]", endpoint: str, log: list[str]) -> None:
        self.proc, self.endpoint, self.log = proc, endpoint, log

    @classmethod
    def start(cls, *args: str, env: dict[str, str] | None = None, timeout_s: float = 180.0) -> "DaemonProcess":
        """Start the daemon with ``args`` (serve's flags) and wait for its ready line."""
        import subprocess
        import threading

        proc = subprocess.Popen([sys.executable, "-m", "specactor", "serve", "--endpoint", "tcp://127.0.0.1:0",
                                 *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        log: list[str] = []
        ready = threading.Event()
        endpoint: list[str] = []

        def pump() -> None:  # keep reading, so the pipe never fills
            assert proc.stdout is not None
            for line in proc.stdout:
                log.append(line)
                if line.startswith(READY) and not endpoint:
                    endpoint.append(line[len(READY):].split()[0])  # tcp://HOST:PORT or ipc://PATH
                    ready.set()
            ready.set()  # the process ended

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(timeout_s) or not endpoint:
            proc.kill()
            proc.wait()
            raise RuntimeError("specactor serve did not become ready:\n" + "".join(log))
        return cls(proc, endpoint[0], log)

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``; returns the exit code."""
        import subprocess

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
