"""Actor transport benchmark: round-trip latency and one-way throughput.

    python bench/transport.py [--repeats 5] [--round-trips 2000] [--messages 50000]

For each transport (inproc, ipc, tcp): a Pinger actor in this process
ping-pongs with an Echo actor (in this process for inproc, in a child process
otherwise) and times each round trip, handler to handler; a Producer streams small Payloads to a Sink (both in
this process for inproc, in two child processes otherwise) and the Sink times
first-to-last arrival. Each figure is the median over ``--repeats`` runs.
Writes bench/results/transport.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from pathlib import Path

from specactor import protocol as p
from specactor.actor import ActorSpec, ActorSystem
from specactor.actor.probes import Collector, Echo, Pinger, Producer, Sink

TARGET_P50_US_IPC = 200.0
TARGET_MSGS_PER_S = 20_000.0


async def _round_trips(transport: str, n: int) -> list[float]:
    """Actor-to-actor ping-pong: the Pinger's handler sends the next Ping on
    each Pong; the Echo's runtime answers each Ping."""
    async with ActorSystem(transport) as system:
        client = Collector("client")
        await system.spawn(client)
        if transport == "inproc":
            await system.spawn(Echo("echo"))
            await system.spawn(Pinger("pinger", target="echo"))
        else:
            await system.spawn(ActorSpec(name="echo", cls="specactor.actor.probes:Echo"))
            await system.spawn(Pinger("pinger", target="echo"))
        warmup = n // 10
        await client.send("pinger", p.Payload(seq=n + warmup))
        _, reply = await client.received.get()
        assert isinstance(reply, p.StatsReply)
        return [reply.values[str(i)] for i in range(warmup, n + warmup)]


async def _throughput(transport: str, n: int, size: int) -> float:
    async with ActorSystem(transport) as system:
        client = Collector("client")
        await system.spawn(client)
        if transport == "inproc":
            await system.spawn(Sink("sink"))
            await system.spawn(Producer("producer", target="sink", size=size))
        else:
            await system.spawn(ActorSpec(name="sink", cls="specactor.actor.probes:Sink"))
            await system.spawn(ActorSpec(name="producer", cls="specactor.actor.probes:Producer",
                                         kwargs={"target": "sink", "size": size}))
        await client.send("producer", p.Payload(seq=n))
        while True:
            await asyncio.sleep(0.05)
            await client.send("sink", p.StatsRequest())
            _, reply = await client.received.get()
            assert isinstance(reply, p.StatsReply)
            if reply.values["count"] >= n:
                elapsed_s = (reply.values["last_ns"] - reply.values["first_ns"]) / 1e9
                return (n - 1) / elapsed_s


_RAW_ECHO = """
import sys, zmq
ctx = zmq.Context(); inbox = ctx.socket(zmq.PULL); inbox.bind(sys.argv[1])
out = ctx.socket(zmq.PUSH); out.connect(sys.argv[2])
while True:
    out.send_multipart(inbox.recv_multipart())
"""


def _raw_pyzmq_round_trips(n: int) -> list[float]:
    """Baseline: blocking pyzmq PUSH/PULL ping-pong over ipc with a child process."""
    import subprocess
    import sys
    import tempfile

    import zmq

    where = tempfile.mkdtemp(prefix="sa-raw-")
    ctx = zmq.Context()
    inbox, out = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    inbox.bind(f"ipc://{where}/a")
    out.connect(f"ipc://{where}/b")
    child = subprocess.Popen([sys.executable, "-c", _RAW_ECHO, f"ipc://{where}/b", f"ipc://{where}/a"])
    try:
        frames = p.frames("raw", p.Ping(seq=0))
        out.send_multipart(frames)
        inbox.recv_multipart()  # connected
        samples = []
        for i in range(n + n // 10):
            t0 = time.perf_counter_ns()
            out.send_multipart(frames)
            inbox.recv_multipart()
            if i >= n // 10:
                samples.append((time.perf_counter_ns() - t0) / 1000)
        return samples
    finally:
        child.kill()
        ctx.destroy(linger=0)


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> dict:
    rows = {}
    for transport in ("inproc", "ipc", "tcp"):
        p50s, p99s, rates = [], [], []
        for _ in range(args.repeats):
            samples = await _round_trips(transport, args.round_trips)
            p50s.append(_pct(samples, 0.50))
            p99s.append(_pct(samples, 0.99))
            rates.append(await _throughput(transport, args.messages, args.size))
        rows[transport] = {
            "rtt_p50_us": statistics.median(p50s),
            "rtt_p99_us": statistics.median(p99s),
            "one_way_msgs_per_s": statistics.median(rates),
            "runs": {"rtt_p50_us": p50s, "rtt_p99_us": p99s, "one_way_msgs_per_s": rates},
        }
        if transport == "ipc":
            raw = [_pct(_raw_pyzmq_round_trips(args.round_trips), 0.5) for _ in range(args.repeats)]
            rows[transport]["raw_pyzmq_rtt_p50_us"] = statistics.median(raw)
            rows[transport]["runs"]["raw_pyzmq_rtt_p50_us"] = raw
        print(f"{transport}: p50 {rows[transport]['rtt_p50_us']:.0f} us, p99 {rows[transport]['rtt_p99_us']:.0f} us, "
              f"{rows[transport]['one_way_msgs_per_s']:,.0f} msg/s", flush=True)
    return rows


def table(rows: dict) -> str:
    lines = ["| transport | round trip p50 (µs) | round trip p99 (µs) | one-way (msg/s) |", "|---|---|---|---|"]
    for transport, r in rows.items():
        lines.append(f"| {transport} | {r['rtt_p50_us']:.0f} | {r['rtt_p99_us']:.0f} | {r['one_way_msgs_per_s']:,.0f} |")
    raw = rows.get("ipc", {}).get("raw_pyzmq_rtt_p50_us")
    if raw:
        lines.append("")
        lines.append(f"Baseline, same script: blocking pyzmq ping-pong over ipc, no actors: p50 {raw:.0f} µs "
                     f"(actor round trip / raw = {rows['ipc']['rtt_p50_us'] / raw:.2f}x).")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--round-trips", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=64, help="payload bytes per message")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "transport.json"))
    args = parser.parse_args()
    try:
        import uvloop

        rows = uvloop.run(main(args))
    except ImportError:
        rows = asyncio.run(main(args))
    ipc = rows["ipc"]
    verdict = {
        "ipc_p50_under_200us": ipc["rtt_p50_us"] < TARGET_P50_US_IPC,
        "one_way_at_least_20k_everywhere": all(r["one_way_msgs_per_s"] >= TARGET_MSGS_PER_S for r in rows.values()),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {platform.processor() or ''} "
        f"{__import__('os').cpu_count()} cores, Python {platform.python_version()}",
        "args": vars(args), "results": rows, "targets_met": verdict}, indent=2))
    print()
    print(table(rows))
    print(verdict)
