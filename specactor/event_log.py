"""Reading an events file: where did the time go, and which drafter earned it.

``specactor events summarize EVENTS.jsonl`` prints, per drafting method, the
drafts, tokens drafted and accepted, mean accepted length and share of the
committed tokens; per actor, busy and idle time; the verifier's steps by batch
size (median forward and step time, tokens drafted and committed a step: two
runs of the same work compare at equal batch, so a slower run shows whether its
drafts, its forwards or the rest of its steps cost); the tail (after 90% of the requests finished); and what the
policy decided. ``specactor events plot``
draws batch size and tokens/s over time, acceptance per method over the
rollout, and one lane per request coloured by its assigned drafter. Both read
a log compressed with gzip (``EVENTS.jsonl.gz``) as well: a long T=1 rollout
writes about a megabyte of events, a tenth of that compressed.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specactor.compressed import read_text


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """Every event of a JSON-lines file, plain or gzip-compressed, in time order; a bad line is an
    error naming it."""
    events = []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(event, dict) or "event" not in event or "ts" not in event:
            raise ValueError(f"{path}:{number}: not an event (needs 'event' and 'ts')")
        events.append(event)
    if not events:
        raise ValueError(f"{path}: no events")
    events.sort(key=lambda e: e["ts"])
    return events


def read_event_files(paths: list[str | Path]) -> list[dict[str, Any]]:
    """The events of several files (a pool's replicas on several nodes), merged in time order."""
    events = [event for path in paths for event in read_events(path)]
    events.sort(key=lambda e: e["ts"])
    return events


def at_version(events: list[dict[str, Any]], version: int) -> list[dict[str, Any]]:
    """The events of one RL step: from the verifier's switch to policy version ``version``
    (its ``verify.weights`` event; version 0: the start) to its next switch. An error names
    the versions the log holds if it has none at ``version``."""
    current, kept, seen = 0, [], [0]
    for event in events:
        if event["event"] == "verify.weights" and event.get("ok", True):
            current = int(event.get("version", current))
            seen.append(current)
        if current == version:
            kept.append(event)
    if not kept:
        raise ValueError(f"no events at policy version {version}; the log has versions "
                         f"{', '.join(map(str, sorted(set(seen))))}")
    return kept


@dataclass
class MethodSummary:
    drafts: int = 0  # request-drafts produced by the method's DraftActor
    draft_s: float = 0.0
    drafted: int = 0  # draft tokens the verifier checked
    accepted: int = 0
    verified: int = 0  # request-drafts the verifier checked

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass
class BatchSteps:
    """The verify steps that ran at one batch size."""

    forward_ms: list[float] = field(default_factory=list)
    #: the whole step (sampling and bookkeeping too): on a GPU the forward is the device's time, and
    #: the host's share around it is where two runs at the same batch can differ (up to 10% on an H100)
    step_ms: list[float] = field(default_factory=list)
    drafted: int = 0
    committed: int = 0

    @property
    def steps(self) -> int:
        return len(self.forward_ms)

    @property
    def median_forward_ms(self) -> float:
        return statistics.median(self.forward_ms) if self.forward_ms else 0.0

    @property
    def median_step_ms(self) -> float:
        return statistics.median(self.step_ms) if self.step_ms else 0.0


@dataclass
class Summary:
    span_s: float
    requests: int
    tokens: int
    methods: dict[str, MethodSummary]
    busy_s: dict[str, float]
    tail_s: float
    tail_tokens_per_s: float
    head_tokens_per_s: float
    policy: Counter = field(default_factory=Counter)
    reasons: Counter = field(default_factory=Counter)
    by_batch: dict[int, BatchSteps] = field(default_factory=dict)  # verify steps by batch size
    graphs: "GraphSteps | None" = None  # the steps replayed as CUDA graphs, if any were
    #: the policy's plan spacing changes (policy.plan_gap): its plans took too long beside the steps
    plan_gaps: list[dict[str, Any]] = field(default_factory=list)
    #: a pool's replicas (events that carry ``replica``): index -> [requests finished, tokens]
    replicas: dict[int, list[int]] = field(default_factory=dict)


@dataclass
class GraphSteps:
    """Steps replayed as CUDA graphs (a GPU): their step_ms is what a step cost (forward_ms is the
    replay's GPU time, without the sampler and bookkeeping around it)."""

    step_ms: list[float] = field(default_factory=list)
    captured_mid_run: int = 0  # shapes captured inside a step
    capture_mid_run_s: float = 0.0
    captured_before: int = 0  # shapes captured before serving
    capture_before_s: float = 0.0


def summarize(events: list[dict[str, Any]]) -> Summary:
    start, end = events[0]["ts"], events[-1]["ts"]
    methods: dict[str, MethodSummary] = defaultdict(MethodSummary)
    busy: dict[str, float] = defaultdict(float)
    policy: Counter = Counter()
    reasons: Counter = Counter()
    by_batch: dict[int, BatchSteps] = defaultdict(BatchSteps)
    graphs = GraphSteps()
    plan_gaps = [e for e in events if e["event"] == "policy.plan_gap"]
    finished = [e for e in events if e["event"] == "request.finished"]
    steps = [e for e in events if e["event"] in ("verify.step", "engine.step")]
    replicas: dict[int, list[int]] = {}
    for e in events:
        name = e["event"]
        where = f"replica{e['replica']}/" if "replica" in e else ""  # a pool's actors, told apart
        if name == "draft.chunk":
            m = methods[e.get("method", "?")]
            m.drafts += int(e.get("requests", 0))
            m.draft_s += float(e.get("draft_ms", 0)) / 1000
            busy[where + e.get("actor", "?")] += float(e.get("draft_ms", 0)) / 1000
        elif name == "request.finished" and where:
            counts = replicas.setdefault(int(e["replica"]), [0, 0])
            counts[0] += 1
            counts[1] += int(e.get("tokens", 0))
        elif name == "verify.step":
            busy[where + e.get("actor", "verifier")] += float(e.get("step_ms", e.get("forward_ms", 0))) / 1000
            at = by_batch[int(e.get("batch_size", 0))]
            at.forward_ms.append(float(e.get("forward_ms", e.get("step_ms", 0))))
            at.step_ms.append(float(e.get("step_ms", e.get("forward_ms", 0))))
            at.drafted += int(e.get("drafted", 0))
            at.committed += int(e.get("new_tokens", 0))
            if e.get("graph"):
                graphs.step_ms.append(float(e.get("step_ms", 0)))
            for method, counts in (e.get("methods") or {}).items():
                m = methods[method]
                m.drafted += int(counts[0])
                m.accepted += int(counts[1])
                m.verified += int(counts[2]) if len(counts) > 2 else 1
        elif name == "verify.graph_captured":
            graphs.captured_mid_run += 1
            graphs.capture_mid_run_s += float(e.get("capture_ms", 0)) / 1000
        elif name == "verify.graphs_captured":
            graphs.captured_before += int(e.get("shapes", 0))
            graphs.capture_before_s += float(e.get("seconds", 0))
        elif name == "engine.step":  # logs written before every mode ran through the verifier actor
            busy[where + e.get("actor", "engine")] += (float(e.get("forward_ms", 0)) + float(e.get("sample_ms", 0))) / 1000
        elif name == "policy.assign":
            ms = e.get("methods") or []
            kind = "off" if not ms else ("racing" if len(ms) > 1 else "single")
            summary_reason = str(e.get("reason", "")).split(":")[0]
            policy[kind] += 1
            reasons[summary_reason] += 1
    tokens = sum(int(e.get("tokens", 0)) for e in finished) or sum(int(e.get("new_tokens", 0)) for e in steps)
    tail_s, tail_rate, head_rate = 0.0, 0.0, 0.0
    if finished:
        cut = finished[max(0, int(0.9 * len(finished)) - 1)]["ts"]
        tail_s = finished[-1]["ts"] - cut
        head = sum(int(e.get("new_tokens", 0)) for e in steps if e["ts"] <= cut)
        tail = sum(int(e.get("new_tokens", 0)) for e in steps if e["ts"] > cut)
        head_rate = head / max(cut - start, 1e-9)
        tail_rate = tail / max(tail_s, 1e-9) if tail_s else 0.0
    used = graphs.step_ms or graphs.captured_before or graphs.captured_mid_run
    return Summary(end - start, len(finished), tokens, dict(methods), dict(busy), tail_s, tail_rate, head_rate,
                   policy, reasons, dict(sorted(by_batch.items())), graphs if used else None, plan_gaps,
                   dict(sorted(replicas.items())))


def format_summary(s: Summary) -> str:
    lines = [f"{s.requests} requests, {s.tokens} tokens in {s.span_s:.2f} s "
             f"({s.tokens / max(s.span_s, 1e-9):.1f} tokens/s)", ""]
    if s.methods:
        committed = max(s.tokens, 1)
        lines += ["| method | drafts | draft time | tokens drafted | accepted | acceptance | "
                  "mean accepted length | share of committed tokens |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, m in sorted(s.methods.items()):
            mean_len = 1 + m.accepted / m.verified if m.verified else 0.0
            lines.append(f"| {name} | {m.drafts} | {m.draft_s:.2f} s | {m.drafted} | {m.accepted} | "
                         f"{m.acceptance:.0%} | {mean_len:.2f} | {m.accepted / committed:.0%} |")
        lines.append("")
    if s.replicas:
        lines += ["| replica | requests | tokens |", "|---|---|---|"]
        lines += [f"| {i} | {requests} | {tokens} |" for i, (requests, tokens) in s.replicas.items()]
        lines.append("")
    lines += ["| actor | busy | idle |", "|---|---|---|"]
    for actor, seconds in sorted(s.busy_s.items()):
        lines.append(f"| {actor} | {seconds:.2f} s ({seconds / max(s.span_s, 1e-9):.0%}) | "
                     f"{max(s.span_s - seconds, 0):.2f} s |")
    if s.by_batch:
        lines += ["", "| batch | verify steps | forward, median | step, median | drafted a step | committed a step |",
                  "|---|---|---|---|---|---|"]
        for batch, at in s.by_batch.items():  # batch 0: a first step, counted before its prompts joined
            lines.append(f"| {batch} | {at.steps} | {at.median_forward_ms:.1f} ms | {at.median_step_ms:.1f} ms | "
                         f"{at.drafted / at.steps:.2f} | {at.committed / at.steps:.2f} |")
    if s.graphs is not None:
        g, steps = s.graphs, sum(at.steps for at in s.by_batch.values())
        median = f", median step {statistics.median(g.step_ms):.1f} ms" if g.step_ms else ""
        lines += ["", f"CUDA graphs: {len(g.step_ms)} of {steps} verify steps replayed{median}; "
                      f"{g.captured_before} shapes captured before serving in "
                      f"{g.capture_before_s:.2f} s, {g.captured_mid_run} during the run in "
                      f"{g.capture_mid_run_s:.2f} s"]
    lines += ["", f"tail (after 90% of requests finished): {s.tail_s:.2f} s, "
                  f"{s.tail_tokens_per_s:.1f} tokens/s against {s.head_tokens_per_s:.1f} before"]
    if s.policy:
        lines += ["", "policy: " + ", ".join(f"{k} {v}" for k, v in s.policy.most_common()),
                  "reasons: " + ", ".join(f"{k} {v}" for k, v in s.reasons.most_common())]
    if s.plan_gaps:
        widest = max(s.plan_gaps, key=lambda e: int(e.get("steps", 0)))
        lines += [f"policy plans spaced out {len(s.plan_gaps)} times, at most to every {widest.get('steps')} steps "
                  f"(a plan {widest.get('plan_ms')} ms against steps of {widest.get('step_ms')} ms at batch "
                  f"{widest.get('batch')}): planning kept to a quarter of the time"]
    return "\n".join(lines)


def plot(events: list[dict[str, Any]], out: str | Path) -> Path:
    """Three panels: batch and speed over time, acceptance per method, request lanes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = events[0]["ts"]
    steps = [e for e in events if e["event"] in ("verify.step", "engine.step")]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(11, 11), constrained_layout=True)

    t = [e["ts"] - start for e in steps]
    ax1.step(t, [e.get("batch_size", 0) for e in steps], where="post", color="tab:blue", label="batch size")
    ax1.set_xlabel("time (s)")
    ax1.set_ylabel("batch size", color="tab:blue")
    speed = ax1.twinx()
    window = 1.0  # seconds of tokens/s smoothing
    rates, acc, j = [], 0, 0
    for i, e in enumerate(steps):
        acc += int(e.get("new_tokens", 0))
        while steps[j]["ts"] < e["ts"] - window:
            acc -= int(steps[j].get("new_tokens", 0))
            j += 1
        rates.append(acc / window)
    speed.plot(t, rates, color="tab:orange", label="tokens/s (1 s window)")
    speed.set_ylabel("tokens/s", color="tab:orange")
    ax1.set_title("Batch size and throughput")

    per_method: dict[str, list[tuple[float, int, int]]] = defaultdict(list)
    first = steps[0]["ts"] if steps else start  # progress counts from the first step, not from start-up
    for e in steps:
        for method, counts in (e.get("methods") or {}).items():
            per_method[method].append((e["ts"] - first, int(counts[0]), int(counts[1])))
    span = max(events[-1]["ts"] - first, 1e-9)
    bins = 20
    for method, rows in sorted(per_method.items()):
        drafted, accepted = [0] * bins, [0] * bins
        for ts, d, a in rows:
            b = min(int(ts / span * bins), bins - 1)
            drafted[b] += d
            accepted[b] += a
        xs = [(b + 0.5) / bins * 100 for b in range(bins) if drafted[b]]
        ys = [accepted[b] / drafted[b] for b in range(bins) if drafted[b]]
        ax2.plot(xs, ys, marker="o", label=method)
    ax2.set_xlim(0, 100)
    ax2.set_ylim(0, 1.05)
    ax2.set_xlabel("rollout progress (% of wall time)")
    ax2.set_ylabel("draft tokens accepted")
    ax2.set_title("Acceptance per method")
    if per_method:
        ax2.legend(loc="lower left")

    lanes: dict[str, list[tuple[float, str]]] = defaultdict(list)
    finish: dict[str, float] = {}
    for e in events:
        if e["event"] == "policy.assign":
            ms = e.get("methods") or []
            lanes[e["request_id"]].append((e["ts"] - start, "+".join(ms) if ms else "off"))
        elif e["event"] == "request.finished":
            finish[e["request_id"]] = e["ts"] - start
            lanes.setdefault(e["request_id"], [(max(e["ts"] - start - float(e.get("latency_s", 0)), 0), "static")])
    colours: dict[str, Any] = {}
    palette = plt.get_cmap("tab10")
    total = events[-1]["ts"] - start
    order = sorted(lanes, key=lambda r: finish.get(r, total))
    for y, rid in enumerate(order):
        segments = lanes[rid]
        end = finish.get(rid, total)
        for (t0, label), nxt in zip(segments, segments[1:] + [(end, "")]):
            colour = colours.setdefault(label, palette(len(colours) % 10))
            ax3.barh(y, max(nxt[0] - t0, total / 500), left=t0, height=0.8, color=colour)
    ax3.set_xlabel("time (s)")
    ax3.set_ylabel("request (by finish time)")
    ax3.set_title("Requests, coloured by assigned drafter")
    ax3.set_yticks([])
    if colours:
        from matplotlib.patches import Patch

        ax3.legend(handles=[Patch(color=c, label=lab) for lab, c in colours.items()], loc="lower right",
                   fontsize="small")
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
