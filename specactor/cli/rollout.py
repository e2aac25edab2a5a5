"""``specactor rollout``: prompts in, token-level samples with log-probs out.

Every mode runs through :class:`~specactor.RolloutEngine`, the same engine the
Python API and the daemon use: the verifier in a process of its own, drafters
beside it. This process holds only the tokenizer. Seeds follow the one rule of
:mod:`specactor.seeds` with the input line's ``id`` as the request's identity,
so a line with id X and seed S gives, sample by sample, the tokens of
``generate(prompt_ids, SamplingParams(seed=S, n=...), request_id=X)``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import msgspec

from specactor.backends import check_backend
from specactor.config import EngineConfig
from specactor.events import configure_events, get_logger
from specactor.prompts import Prompt, load_prompts
from specactor.protocol import RequestResult, SamplingParams
from specactor.calls import Call, Job, expand


@dataclass
class RolloutOptions:
    """What to generate; how is ``engine`` (its ``max_len`` and ``max_batch`` are fitted to the prompts)."""

    prompts: str
    out: str
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(mode="autoregressive",
                                                                      drafters=["ngram", "suffix"]))
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    n: int = 1
    chat: bool = True
    progress: bool | None = None
    resume: bool = False  # keep the samples OUT (or an interrupted run's OUT.partial.jsonl) already holds
    replicas: int | None = None  # run on a RolloutPool of this many replicas (Ray)
    ray_address: str | None = None


def build_call(prompts: list[Prompt], opts: RolloutOptions, tokenizer: Any) -> Call:
    """One request per prompt line, named by its id; a line's own fields override the flags."""
    prompt_ids, params = [], []
    for prompt in prompts:
        if prompt.prompt_ids is not None:
            ids = list(prompt.prompt_ids)
        elif opts.chat and tokenizer.chat_template:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}])
        else:
            ids = tokenizer.encode(prompt.text)
        prompt_ids.append(ids)
        params.append(SamplingParams(
            temperature=prompt.temperature if prompt.temperature is not None else opts.temperature,
            top_p=opts.top_p, top_k=opts.top_k, max_tokens=prompt.max_tokens or opts.max_tokens,
            seed=prompt.seed, n=prompt.n or opts.n))
    return Call(prompt_ids, params, [prompt.id for prompt in prompts], single=False)


def result_line(prompt: Prompt, job: Job, result: RequestResult, latency_s: float, tokenizer: Any) -> dict[str, Any]:
    stats = result.stats
    line: dict[str, Any] = {
        "id": prompt.id,
        "sample": job.sample,
        "prompt_ids": job.prompt_ids,
        "token_ids": list(result.token_ids),
        "logprobs": list(result.logprobs),
        "finish_reason": str(result.finish_reason),
        "text": tokenizer.decode(list(result.token_ids)),
        "stats": {
            "drafted": stats.drafted,
            "accepted": stats.accepted,
            "verify_steps": stats.verify_steps,
            "per_method": dict(stats.per_method),
            "latency_s": round(latency_s, 4),
        },
    }
    if result.error:
        line["error"] = result.error
    if prompt.meta is not None:
        line["meta"] = prompt.meta
    return line


def run_rollout(opts: RolloutOptions) -> dict[str, Any]:
    """Run a rollout end to end; returns the summary (also printed)."""
    from specactor.engine.model_registry import resolve_model
    from specactor.tokenizer import Tokenizer
    from specactor.engine.config import ModelConfig
    from specactor.engine.kv_cache import KVCache

    check_backend(opts.engine)
    events = opts.engine.events_path
    if events:  # this process's events too (the summary), not only the engine's
        configure_events(events, console_level="warning")
    log = get_logger(actor="rollout")

    prompts = load_prompts(opts.prompts)
    folder = resolve_model(opts.engine.model)
    tokenizer = Tokenizer(folder)
    model_cfg = ModelConfig.from_dir(folder)
    call = build_call(prompts, opts, tokenizer)
    max_len = max(len(ids) + sp.max_tokens for ids, sp in zip(call.prompt_ids, call.params))  # type: ignore[arg-type]
    # nothing starts if any request is impossible: checked here, with the model's vocabulary
    jobs = expand(call, vocab_size=model_cfg.vocab_size, max_len=max_len, default_seed=opts.engine.seed)
    config = replace(opts.engine, max_len=max_len, max_batch=min(opts.engine.max_batch, len(jobs)),
                     events_path=None)
    if config.device == "cpu":  # a GPU's memory is the GPU's business: torch says so if it is short
        check_kv_memory(model_cfg, config.max_batch, max_len, config.torch_dtype)
    by_id = {prompt.id: prompt for prompt in prompts}
    done = load_done(jobs, [opts.out, partial_path(opts.out)]) if opts.resume else {}
    remaining = [job for job in jobs if job.request_id not in done]
    progress = _Progress(len(remaining), opts.progress)
    partial = Path(partial_path(opts.out))
    partial.parent.mkdir(parents=True, exist_ok=True)
    encoder = msgspec.json.Encoder()
    new_lines: dict[str, dict[str, Any]] = {}
    latencies: dict[str, float] = {}
    # every good sample is on disk as soon as it finishes: an interrupted run loses nothing done
    with partial.open("wb") as sink:
        for line in done.values():
            sink.write(encoder.encode(line) + b"\n")
        sink.flush()
        jobs_by_id = {job.request_id: job for job in remaining}

        def keep(result: RequestResult, latency_s: float) -> None:
            job = jobs_by_id[result.request_id]
            line = result_line(by_id[job.parent_id], job, result, latency_s, tokenizer)
            new_lines[job.request_id], latencies[job.request_id] = line, latency_s
            if line["finish_reason"] != "error":
                sink.write(encoder.encode(line) + b"\n")
                sink.flush()

        try:
            verifier, startup, wall = asyncio.run(_generate(config, remaining, progress, keep, opts)) \
                if remaining else ({}, 0.0, 0.0)
        finally:
            progress.close()
    lines = [done.get(job.request_id) or new_lines[job.request_id] for job in jobs]
    failed = [line for line in lines if line["finish_reason"] == "error"]
    if failed:  # OUT stays as it was; the good samples stay in OUT.partial.jsonl for --resume
        out_path = write_lines([new_lines.get(job.request_id) or done[job.request_id] for job in jobs],
                               failed_path(opts.out))
    else:
        out_path = write_lines(lines, opts.out)  # in input order
        partial.unlink(missing_ok=True)
    lines = [new_lines[job.request_id] for job in remaining]  # what this run generated

    total_tokens = sum(len(line["token_ids"]) for line in lines)
    ordered = sorted(latencies.values())
    summary = {
        "mode": config.mode,
        "model": str(folder),
        "prompts": len(prompts),
        "samples": len(jobs),
        "output_tokens": total_tokens,
        "resumed": len(done),
        "wall_s": wall,
        "tokens_per_s": total_tokens / wall if wall else 0.0,
        "steps": int(verifier.get("steps", 0)),
        "verifier_threads": int(verifier.get("threads", 0)),  # as the verifier reports them, not as asked
        "verifier_dtype": "bfloat16" if verifier.get("bfloat16") else "float32",
        "p50_latency_s": ordered[len(ordered) // 2] if ordered else 0.0,
        "max_latency_s": ordered[-1] if ordered else 0.0,
        "finish_reasons": _count(line["finish_reason"] for line in lines),
        "startup_s": startup,
        "device": config.device,
        "dtype": config.dtype,
        "kv_cache_mb": KVCache.bytes_needed(model_cfg, config.max_batch, max_len, config.torch_dtype) / 2**20,
        "drafted": sum(line["stats"]["drafted"] for line in lines),
        "accepted": sum(line["stats"]["accepted"] for line in lines),
        "per_method": _per_method(lines),
        "out": str(out_path),
    }
    log.info("rollout.summary", **{k: v for k, v in summary.items() if not isinstance(v, dict)})
    print_summary(summary)
    if failed:
        raise ValueError(f"{len(failed)} of {len(jobs)} samples failed (written to {out_path} with their "
                         f"error): first: {failed[0]['id']}#{failed[0]['sample']}: {failed[0].get('error')}; "
                         f"the good ones are in {partial}: rerun with --resume to generate only the rest")
    return summary


async def _generate(config: EngineConfig, jobs: list[Job], progress: "_Progress",
                    keep: Callable[[RequestResult, float], None], opts: RolloutOptions,
                    ) -> tuple[dict[str, float], float, float]:
    """Run ``jobs`` (on one engine, or a pool of ``opts.replicas``), handing each result to ``keep``
    with its latency as it finishes; returns the verifier's stats (summed over replicas), start-up
    and generation seconds."""
    from specactor.rollout_engine import RolloutEngine

    tokens = 0
    begin = time.perf_counter()
    if opts.replicas:
        from specactor.pool import RolloutPool

        runner: Any = RolloutPool(config, replicas=opts.replicas, ray_address=opts.ray_address)
    else:
        runner = RolloutEngine(config)
    async with runner as engine:
        start = time.perf_counter()
        async for result in engine.stream_jobs(jobs):
            now = time.perf_counter()
            keep(result, now - start)
            tokens += len(result.token_ids)
            progress.update(1, tokens, now - start)
        wall = time.perf_counter() - start
        stats = await engine.stats()
    return stats.get("verifier", {}), start - begin, wall


def partial_path(out: str) -> str:
    """Where a rollout writes each good sample as it finishes: ``OUT.partial.jsonl`` beside ``OUT``."""
    path = Path(out)
    return str(path.with_name(path.name.removesuffix(".jsonl") + ".partial.jsonl"))


def load_done(jobs: list[Job], paths: list[str]) -> dict[str, dict[str, Any]]:
    """The good samples the files already hold, by sample id, for ``--resume`` (later files win;
    a line cut short by an interrupted write is ignored). ValueError if a line's prompt is not
    the prompt this run has for its id: that file is another rollout's."""
    wanted = {(job.parent_id, job.sample): job for job in jobs}
    done: dict[str, dict[str, Any]] = {}
    for path in map(Path, paths):
        if not path.is_file():
            continue
        for number, raw in enumerate(path.read_bytes().splitlines(), 1):
            try:
                line = msgspec.json.decode(raw)
                key = (line["id"], line["sample"])
            except (msgspec.DecodeError, KeyError, TypeError):
                continue
            job = wanted.get(key)
            if job is None or line.get("finish_reason") == "error":
                continue
            if line.get("prompt_ids") != job.prompt_ids:
                raise ValueError(f"{path}:{number}: sample {key[0]}#{key[1]} has another prompt than this run's: "
                                 f"that file holds another rollout (drop --resume, or choose another --out)")
            done[job.request_id] = line
    return done


def failed_path(out: str) -> str:
    """Where a rollout with failed samples writes its lines: ``OUT.failed.jsonl`` beside ``OUT``."""
    path = Path(out)
    return str(path.with_name(path.name.removesuffix(".jsonl") + ".failed.jsonl"))


def write_lines(lines: list[dict[str, Any]], out: str) -> Path:
    """Write JSON lines atomically (a temporary file, then a rename)."""
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    encoder = msgspec.json.Encoder()
    with tmp.open("wb") as f:
        for line in lines:
            f.write(encoder.encode(line) + b"\n")
    os.replace(tmp, out_path)
    return out_path


def _per_method(lines: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    totals: dict[str, dict[str, int]] = {}
    for line in lines:
        for method, counts in line["stats"]["per_method"].items():
            into = totals.setdefault(method, {"drafted": 0, "accepted": 0, "steps": 0})
            for key, value in counts.items():
                into[key] = into.get(key, 0) + value
    return totals


def check_kv_memory(cfg: Any, max_batch: int, max_len: int, dtype: Any = None, fraction: float = 0.8) -> None:
    """Refuse a KV cache that would not fit in memory, saying what to lower."""
    import psutil
    import torch

    from specactor.engine.kv_cache import KVCache

    need = KVCache.bytes_needed(cfg, max_batch, max_len, dtype or torch.float32)
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
        ("verify steps", f"{summary['steps']:,}"),
        ("device / dtype", f"{summary['device']} / {summary['dtype']}"),
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
