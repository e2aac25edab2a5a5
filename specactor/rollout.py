"""``specactor rollout``: prompts in, token-level samples with log-probs out.

Builds one :class:`Sequence` per (prompt, sample); the per-request seed is
derived from (base seed, prompt id, sample index), so one input file gives the
same seeds, and hence the same tokens, in every mode.
"""

from __future__ import annotations

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
from specactor.verifier.engine import Engine, Sequence, StepReport, derive_seed

MODES = ("autoregressive", "coupled", "specactor")


@dataclass
class RolloutOptions:
    prompts: str
    out: str
    model: str | None = None
    mode: str = "autoregressive"
    drafters: str = "ngram,suffix,model"
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
    if opts.mode != "autoregressive":
        raise NotImplementedError(
            f"--mode {opts.mode} needs the speculation engine (drafters + VerifyActor), which is not built yet; "
            "use --mode autoregressive")
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
    engine = Engine(model, max_batch=max_batch, max_len=max_len, eos_token_ids=eos)
    for _, _, seq in jobs:
        engine.add(seq)  # validates: nothing runs if any request is impossible

    total_tokens = 0
    start = time.perf_counter()
    progress = _Progress(len(jobs), opts.progress)

    def on_step(report: StepReport) -> None:
        nonlocal total_tokens
        total_tokens += report.new_tokens
        log.info("engine.step", step=engine.steps, batch_size=report.batch_size,
                 prefill_tokens=report.prefill_tokens, new_tokens=report.new_tokens,
                 forward_ms=round(report.forward_s * 1000, 2), sample_ms=round(report.sample_s * 1000, 2))
        for seq in report.finished:
            log.info("request.finished", request_id=seq.request_id, tokens=len(seq.output_ids),
                     finish_reason=str(seq.finish_reason), latency_s=round(seq.finish_s - seq.arrival_s, 4))
        progress.update(len(report.finished), total_tokens, time.perf_counter() - start)

    try:
        while engine.has_work:
            on_step(engine.step())
    finally:
        progress.close()
    wall = time.perf_counter() - start

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
        "steps": engine.steps,
        "p50_latency_s": latencies[len(latencies) // 2],
        "max_latency_s": latencies[-1],
        "finish_reasons": _count(str(s.finish_reason) for _, _, s in jobs),
        "model_load_s": load_s,
        "kv_cache_mb": engine.cache.nbytes / 2**20,
        "out": str(out_path),
    }
    log.info("rollout.summary", **{k: v for k, v in summary.items() if not isinstance(v, dict)})
    print_summary(summary)
    return summary


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
        ("wall time", f"{summary['wall_s']:.1f} s"),
        ("tokens/s", f"{summary['tokens_per_s']:,.1f}"),
        ("engine steps", f"{summary['steps']:,}"),
        ("latency p50 / max", f"{summary['p50_latency_s']:.1f} s / {summary['max_latency_s']:.1f} s"),
        ("finish reasons", ", ".join(f"{k} {v}" for k, v in sorted(summary["finish_reasons"].items()))),
        ("KV cache", f"{summary['kv_cache_mb']:,.0f} MB"),
        ("output", summary["out"]),
    ]
    for key, value in rows:
        table.add_row(key, value)
    Console(stderr=True).print(table)
