"""``specactor rollout``: prompts in, token-level samples with log-probs out.

Builds one :class:`Sequence` per (prompt, sample); the per-request seed is
derived from (base seed, prompt id, sample index), so one input file gives the
same seeds, and hence the same tokens, in every mode.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch

from specactor.events import configure_events, get_logger
from specactor.prompts import Prompt, load_prompts
from specactor.protocol import SamplingParams
from specactor.verifier.engine import Engine, Sequence, check_request, derive_seed
from specactor.verifier.kv_cache import KVCache

MODES = ("autoregressive", "coupled", "specactor")


@dataclass
class RolloutOptions:
    prompts: str
    out: str
    model: str | None = None
    mode: str = "autoregressive"
    drafters: str = "ngram,suffix"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    n: int = 1
    seed: int = 0
    events: str | None = None
    max_batch: int = 32
    threads: int | None = None
    chat: bool = True
    progress: bool | None = None
    k: int = 4
    window: int = 8
    policy: bool = True  # specactor mode: the Fastest-of-N policy
    racing: bool = True


def build_sequences(prompts: list[Prompt], opts: RolloutOptions, tokenizer: Any) -> list[tuple[Prompt, int, Sequence]]:
    """Expand prompts into (prompt, sample index, Sequence) with derived seeds."""
    out = []
    for prompt in prompts:
        if prompt.prompt_ids is not None:
            ids = list(prompt.prompt_ids)
        elif opts.chat and tokenizer.chat_template:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}])
        else:
            ids = tokenizer.encode(prompt.text)
        for sample in range(prompt.n or opts.n):
            base_seed = prompt.seed if prompt.seed is not None else opts.seed
            params = SamplingParams(
                temperature=prompt.temperature if prompt.temperature is not None else opts.temperature,
                top_p=opts.top_p, top_k=opts.top_k,
                max_tokens=prompt.max_tokens or opts.max_tokens,
                seed=derive_seed(base_seed, prompt.id, sample), n=1,
            )
            seq = Sequence(f"{prompt.id}#{sample}", ids, params, seed=params.seed)  # type: ignore[arg-type]
            out.append((prompt, sample, seq))
    return out


def result_line(prompt: Prompt, sample: int, seq: Sequence, tokenizer: Any) -> dict[str, Any]:
    line = {
        "id": prompt.id,
        "sample": sample,
        "prompt_ids": seq.prompt_ids,
        "token_ids": seq.output_ids,
        "logprobs": seq.logprobs,
        "finish_reason": str(seq.finish_reason),
        "text": tokenizer.decode(seq.output_ids),
        "stats": {
            "drafted": seq.drafted,
            "accepted": seq.accepted,
            "verify_steps": seq.steps,
            "per_method": seq.per_method,
            "latency_s": round(seq.finish_s - seq.arrival_s, 4),
        },
    }
    if prompt.meta is not None:
        line["meta"] = prompt.meta
    return line


def run_rollout(opts: RolloutOptions) -> dict[str, Any]:
    """Run a rollout end to end; returns the summary (also printed)."""
    from specactor.models import resolve_model
    from specactor.tokenizer import Tokenizer
    from specactor.verifier.weights import load_causal_lm

    if opts.mode not in MODES:
        raise ValueError(f"--mode {opts.mode!r}: choose one of {', '.join(MODES)}")
    from specactor.drafters.registry import parse_methods

    drafters = parse_methods(opts.drafters)
    if opts.events:
        configure_events(opts.events, console_level="warning")
    log = get_logger(actor="rollout")
    torch.set_num_threads(opts.threads or os.cpu_count() or 1)

    prompts = load_prompts(opts.prompts)
    folder = resolve_model(opts.model)
    t_load = time.perf_counter()
    model = load_causal_lm(folder)
    tokenizer = Tokenizer(folder)
    load_s = time.perf_counter() - t_load
    jobs = build_sequences(prompts, opts, tokenizer)
    eos = set(model.cfg.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    max_len = max(len(s.prompt_ids) + s.params.max_tokens for _, _, s in jobs)
    max_batch = min(opts.max_batch, len(jobs))
    check_kv_memory(model.cfg, max_batch, max_len)
    for _, _, seq in jobs:  # nothing runs if any request is impossible
        check_request(seq, model.cfg.vocab_size, max_len)
    start = time.perf_counter()
    startup = 0.0
    progress = _Progress(len(jobs), opts.progress)
    try:
        if opts.mode == "autoregressive":
            steps = _run_in_process(model, jobs, max_batch, max_len, eos, progress, log)
        else:
            steps, startup = asyncio.run(_run_actors(opts, drafters, jobs, max_batch, max_len, progress))
    finally:
        progress.close()
    wall = time.perf_counter() - start - startup
    total_tokens = sum(len(s.output_ids) for _, _, s in jobs)

    out_path = Path(opts.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    encoder = msgspec.json.Encoder()
    with tmp.open("wb") as f:
        for prompt, sample, seq in jobs:
            f.write(encoder.encode(result_line(prompt, sample, seq, tokenizer)) + b"\n")
    os.replace(tmp, out_path)

    latencies = sorted(s.finish_s - s.arrival_s for _, _, s in jobs)
    summary = {
        "mode": opts.mode,
        "model": str(folder),
        "prompts": len(prompts),
        "samples": len(jobs),
        "output_tokens": total_tokens,
        "wall_s": wall,
        "tokens_per_s": total_tokens / wall if wall else 0.0,
        "steps": steps,
        "p50_latency_s": latencies[len(latencies) // 2],
        "max_latency_s": latencies[-1],
        "finish_reasons": _count(str(s.finish_reason) for _, _, s in jobs),
        "model_load_s": load_s,
        "startup_s": startup,
        "kv_cache_mb": KVCache.bytes_needed(model.cfg, max_batch, max_len) / 2**20,
        "drafted": sum(s.drafted for _, _, s in jobs),
        "accepted": sum(s.accepted for _, _, s in jobs),
        "per_method": _per_method(jobs),
        "out": str(out_path),
    }
    log.info("rollout.summary", **{k: v for k, v in summary.items() if not isinstance(v, dict)})
    print_summary(summary)
    return summary


def _run_in_process(model: Any, jobs: list, max_batch: int, max_len: int, eos: set[int], progress: "_Progress",
                    log: Any) -> int:
    """The autoregressive baseline: the target engine alone, in this process."""
    engine = Engine(model, max_batch=max_batch, max_len=max_len, eos_token_ids=eos)
    for _, _, seq in jobs:
        engine.add(seq)
    tokens = 0
    start = time.perf_counter()
    while engine.has_work:
        report = engine.step()
        tokens += report.new_tokens
        log.info("engine.step", step=engine.steps, batch_size=report.batch_size,
                 prefill_tokens=report.prefill_tokens, new_tokens=report.new_tokens,
                 forward_ms=round(report.forward_s * 1000, 2), sample_ms=round(report.sample_s * 1000, 2))
        for seq in report.finished:
            log.info("request.finished", request_id=seq.request_id, tokens=len(seq.output_ids),
                     finish_reason=str(seq.finish_reason), latency_s=round(seq.finish_s - seq.arrival_s, 4))
        progress.update(len(report.finished), tokens, time.perf_counter() - start)
    return engine.steps


async def _run_actors(opts: RolloutOptions, drafters: list[str], jobs: list, max_batch: int, max_len: int,
                      progress: "_Progress") -> tuple[int, float]:
    """Speculative modes: verifier and drafters as actors (model drafters in their own process).

    Returns (verify steps, start-up seconds: processes and models loading).
    """
    from specactor.coordinator import EngineConfig, RolloutEngine

    config = EngineConfig(model=opts.model, mode=opts.mode, drafters=drafters, k=opts.k, window=opts.window,
                          max_batch=max_batch, max_len=max_len, transport="ipc", processes=True,
                          policy=opts.policy, racing=opts.racing)
    by_id = {seq.request_id: seq for _, _, seq in jobs}
    tokens = 0
    begin = time.perf_counter()
    async with RolloutEngine(config) as engine:
        start = time.perf_counter()
        futures = [await engine.coordinator.submit(seq.request_id, seq.prompt_ids, seq.params) for _, _, seq in jobs]
        for done in asyncio.as_completed(futures):
            result = await done
            seq = by_id[result.request_id]
            if result.finish_reason == "error":
                raise ValueError(f"request {result.request_id}: {result.error}")
            seq.output_ids, seq.logprobs = list(result.token_ids), list(result.logprobs)
            seq.finish_reason = result.finish_reason
            seq.finish_s = time.perf_counter()
            seq.drafted, seq.accepted = result.stats.drafted, result.stats.accepted
            seq.steps, seq.per_method = result.stats.verify_steps, dict(result.stats.per_method)
            tokens += len(seq.output_ids)
            progress.update(1, tokens, time.perf_counter() - start)
        stats = await engine.stats()
    return int(stats.get("verifier", {}).get("steps", 0)), start - begin


def _per_method(jobs: list) -> dict[str, dict[str, int]]:
    totals: dict[str, dict[str, int]] = {}
    for _, _, seq in jobs:
        for method, counts in seq.per_method.items():
            into = totals.setdefault(method, {"drafted": 0, "accepted": 0, "steps": 0})
            for key, value in counts.items():
                into[key] = into.get(key, 0) + value
    return totals


def check_kv_memory(cfg: Any, max_batch: int, max_len: int, fraction: float = 0.8) -> None:
    """Refuse a KV cache that would not fit in memory, saying what to lower."""
    import psutil

    from specactor.verifier.kv_cache import KVCache

    need = KVCache.bytes_needed(cfg, max_batch, max_len)
    available = psutil.virtual_memory().available
    if need > fraction * available:
        raise ValueError(
            f"the KV cache for {max_batch} requests x {max_len} tokens needs {need / 2**30:.1f} GiB, more than "
            f"{fraction:.0%} of the {available / 2**30:.1f} GiB available: lower --max-batch or --max-tokens")


def _count(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return counts


class _Progress:
    """A rich progress bar on a terminal; silent otherwise."""

    def __init__(self, total: int, enabled: bool | None) -> None:
        self._bar = None
        if enabled is None:
            enabled = sys.stderr.isatty()
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("rollout"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[speed]}"), TimeElapsedColumn(), transient=False)
            self._bar.start()
            self._task = self._bar.add_task("rollout", total=total, speed="")

    def update(self, finished: int, tokens: int, elapsed: float) -> None:
        if self._bar is not None:
            speed = f"{tokens / elapsed:,.1f} tok/s" if elapsed > 0 else ""
            self._bar.update(self._task, advance=finished, speed=speed)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"specactor rollout ({summary['mode']})", show_header=False)
    rows = [
        ("samples", f"{summary['samples']} ({summary['prompts']} prompts)"),
        ("output tokens", f"{summary['output_tokens']:,}"),
        ("wall time", f"{summary['wall_s']:.1f} s" + (f" (+ {summary['startup_s']:.1f} s start-up)"
                                                     if summary["startup_s"] else "")),
        ("tokens/s", f"{summary['tokens_per_s']:,.1f}"),
        ("engine steps", f"{summary['steps']:,}"),
        ("latency p50 / max", f"{summary['p50_latency_s']:.1f} s / {summary['max_latency_s']:.1f} s"),
        ("finish reasons", ", ".join(f"{k} {v}" for k, v in sorted(summary["finish_reasons"].items()))),
        ("KV cache", f"{summary['kv_cache_mb']:,.0f} MB"),
        *[(f"acceptance {m}", f"{c['accepted']}/{c['drafted']} = {c['accepted'] / max(c['drafted'], 1):.0%}, "
           f"{(c['accepted'] + c['steps']) / max(c['steps'], 1):.2f} tokens/step")
          for m, c in sorted(summary.get("per_method", {}).items())],
        ("output", summary["out"]),
    ]
    for key, value in rows:
        table.add_row(key, value)
    Console(stderr=True).print(table)
