"""``specactor bench``: the long-tail RL rollout workload, every mode side by side.

The default workload is what an RL rollout looks like: 8 HumanEval prompts x 4
samples (GRPO groups), each as long as the model's EOS makes it up to 768 tokens,
so the batch starts large and a few long samples form the tail. Every speed
figure is reported per epoch and per phase (before and after half of the samples
finished), beside the ceilings of :mod:`specactor.bench.ceilings` computed from
the same run's lengths and acceptance, and the policy and clairvoyant drafts
replayed on autoregressive's tokens (:mod:`specactor.bench.replay_workload`).

The first temperature (T=1 by default, the RL case) runs ``epochs`` epochs,
the others ``other_epochs`` (1 by default: the bench's 20 minutes on 2 cores go
to the main case). For each temperature: ``autoregressive`` runs first (with ``repeats``,
every second repeat runs the modes in reverse order); its first epoch is
rewarded with the HumanEval tests and one real GRPO step is taken on the
model; every mode then runs epoch 1 on the base weights, loads that same
update, and runs epoch 2 on the same prompts (new seeds), with the first
epoch's samples in its drafters' history. Our engine's outputs are compared
token for token with ``autoregressive``; transformers and vLLM sample
differently, so they are compared only at temperature 0 (greedy).

Nothing finished is lost when a bench is stopped part-way (a time limit, a
machine taken back): each run is appended to ``runs.jsonl`` in ``--out`` as it
ends, and the report is written after every temperature but the last too,
marked partial.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from specactor.bench.ceilings import MAX_WINDOW, from_samples
from specactor.bench.measure import RunRecord
from specactor.bench.runners import Mode, Workload, run_mode, vllm_available
from specactor.bench.update import PolicyUpdate
from specactor.config import EngineConfig
from specactor.memory import release_freed_memory
from specactor.policy.cost_model import CostModel


MODES: dict[str, Mode] = {
    "autoregressive": Mode("autoregressive", "engine", "autoregressive"),
    "transformers": Mode("transformers", "transformers"),
    # transformers cannot batch prompt lookup: one sample at a time, so only on the first prompts
    "transformers+pld": Mode("transformers+pld", "transformers", prompt_lookup=10, max_prompts=2),
    "coupled ngram": Mode("coupled ngram", "engine", "coupled", ["ngram"]),
    "coupled suffix": Mode("coupled suffix", "engine", "coupled", ["suffix"]),
    "specactor": Mode("specactor", "engine", "specactor", ["ngram", "suffix"]),
    "specactor+learned": Mode("specactor+learned", "engine", "specactor", ["ngram", "suffix", "learned"]),
    # the quantised self-copy on a core of its own, lent to the verifier while it drafts nothing
    "specactor+model": Mode("specactor+model", "engine", "specactor", ["ngram", "suffix", "model"], draft_cores=1),
    "vllm": Mode("vllm", "vllm"),
}


DEFAULT_MODES = ("autoregressive", "specactor")
#: One JSON line per finished run, written as each ends (a bench stopped part-way keeps them); the
#: samples' comparison with autoregressive (``differing``) comes later, in suite.json.
RUNS_LOG = "runs.jsonl"


@dataclass
class BenchOptions:
    """The default is the RL long-tail workload (T=1 is the main case; T=0 for the greedy
    comparison with other libraries); the other modes are there through ``modes``."""

    prompts: int = 8
    n: int = 4
    max_tokens: int = 768
    temperatures: tuple[float, ...] = (1.0, 0.0)
    epochs: int = 2  # at the first (main) temperature
    other_epochs: int = 1  # at the others (at most ``epochs``): the whole default bench in ~20 minutes on 2 cores
    repeats: int = 1  # every mode again, interleaved: a 2-core machine drifts by 10% within minutes
    modes: tuple[str, ...] = DEFAULT_MODES
    out: str = "bench/results/suite"
    lr: float = 2e-6
    update_groups: int | None = 4  # prompts whose groups the GRPO step trains on (None: all; see bench/update.py)
    engine: EngineConfig = field(default_factory=EngineConfig)  # every run's settings but mode, drafters, sizes

    @classmethod
    def quick(cls, **overrides: Any) -> "BenchOptions":
        return cls(**{"prompts": 2, "n": 2, "max_tokens": 40, "temperatures": (1.0, 0.0), **overrides})


def build_workload(opts: BenchOptions) -> Workload:
    from specactor.engine.model_registry import resolve_model
    from specactor.prompts import humaneval_problems, humaneval_prompts
    from specactor.tokenizer import Tokenizer
    from specactor.engine.config import ModelConfig

    folder = resolve_model(opts.engine.model)
    tok = Tokenizer(folder)
    prompt_ids = [tok.apply_chat_template([{"role": "user", "content": p.text}])
                  for p in humaneval_prompts(opts.prompts)]
    eos = set(ModelConfig.from_dir(folder).eos_token_ids) | ({tok.eos_token_id} if tok.eos_token_id is not None
                                                              else set())
    return Workload(folder, prompt_ids, humaneval_problems(opts.prompts), opts.n, opts.max_tokens, opts.epochs, eos,
                    opts.engine)


def run_suite(opts: BenchOptions, progress: Any = print) -> dict[str, Any]:
    unknown = [m for m in opts.modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown mode {unknown[0]!r}: choose from {', '.join(MODES)}")
    if not opts.modes or opts.modes[0] != "autoregressive":
        raise ValueError("the autoregressive mode must come first: it is the baseline every mode is compared with")
    work = build_workload(opts)
    started = time.perf_counter()
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "command": " ".join(["specactor", "bench", *sys.argv[2:]]),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}",
        "engine": {"model": opts.engine.model or "smollm2-135m", "device": opts.engine.device,
                   "dtype": opts.engine.dtype, "verifier_threads": opts.engine.verifier_threads,
                   "k": opts.engine.k, "window": opts.engine.max_window},
        "workload": {"prompts": opts.prompts, "n": opts.n, "max_tokens": opts.max_tokens, "epochs": opts.epochs,
                     "other_epochs": min(opts.other_epochs, opts.epochs),
                     "temperatures": list(opts.temperatures), "repeats": opts.repeats},
        "runs": [], "ceilings": [], "update": None, "skipped": {}}
    why_no_vllm = vllm_available()
    update = PolicyUpdate(work, opts.lr, progress, opts.update_groups) if opts.epochs > 1 else None
    main_work = work
    Path(opts.out).mkdir(parents=True, exist_ok=True)
    (Path(opts.out) / RUNS_LOG).unlink(missing_ok=True)
    for index, temperature in enumerate(opts.temperatures):
        work = main_work if index == 0 else replace(main_work, epochs=min(opts.other_epochs, opts.epochs))
        repeats: list[dict[str, list[RunRecord]]] = []
        for repeat in range(opts.repeats):
            repeats.append(_run_modes(opts, work, temperature, update, why_no_vllm, report, progress,
                                      f" (repeat {repeat + 1}/{opts.repeats})" if opts.repeats > 1 else "",
                                      repeat))
        by_mode = median_runs(repeats)
        for records in by_mode.values():
            report["runs"].extend(record.summary() | {"repeats_s": record_repeats(repeats, record)}
                                  for record in records)
        cost = ceiling_cost(opts.engine)  # after the runs: a specactor run measured or found this machine's
        report["ceilings_profile"] = profile_label(cost.source)
        for epoch_ceilings in temperature_ceilings(by_mode, cost, opts.max_tokens, opts.engine.max_window,
                                                   work.sample_prompts()):
            report["ceilings"].append(epoch_ceilings)
            progress(f"T={temperature:g} epoch {epoch_ceilings['epoch'] + 1} ceilings (x vs autoregressive): "
                     f"oracle {epoch_ceilings['oracle']['speedup']:.2f}x, zero-cost "
                     f"{epoch_ceilings['zero_cost']['speedup']:.2f}x, perfect "
                     f"{epoch_ceilings['perfect']['speedup']:.2f}x (scale {epoch_ceilings['scale']:.2f})")
        report["update"] = update.stats if update is not None else None
        report["wall_s"] = round(time.perf_counter() - started, 1)
        if index < len(opts.temperatures) - 1:  # a bench stopped later keeps the temperatures it finished
            write_outputs(report | {"partial": f"written after T={temperature:g}, before the other temperatures "
                                               f"ran (their finished runs, one line each: {RUNS_LOG})"}, opts.out)
    return report


def _run_modes(opts: BenchOptions, work: Workload, temperature: float, update: PolicyUpdate | None, why_no_vllm: str,
               report: dict[str, Any], progress: Any, label: str, repeat: int = 0) -> dict[str, list[RunRecord]]:
    """Every mode once at ``temperature``, in :func:`repeat_order`; outputs compared with
    autoregressive's."""
    names = [name for name in opts.modes if not (name == "vllm" and why_no_vllm)]
    if len(names) < len(opts.modes):
        report["skipped"]["vllm"] = why_no_vllm
    by_mode: dict[str, list[RunRecord]] = {}
    for name in repeat_order(names, repeat):
        progress(f"T={temperature:g} {name}{label} ...")
        events = None
        if MODES[name].kind == "engine":
            # the policy's and verifier's decisions, for `specactor events summarize` (each repeat's: a
            # repeat's own path through the policy is what tells two runs apart); autoregressive's too:
            # it pays for its events as the others do, and its steps are the baseline
            events = str(Path(opts.out) / events_name(name, temperature, repeat))
            Path(events).unlink(missing_ok=True)
        by_mode[name] = run_mode(MODES[name], work, temperature, update, events)
        with open(Path(opts.out) / RUNS_LOG, "a") as log:  # each run on disk as soon as it ends
            for record in by_mode[name]:
                log.write(json.dumps({"repeat": repeat, **record.summary()}) + "\n")
        for record in by_mode[name]:
            phase1, phase2 = record.phases
            progress(f"  epoch {record.epoch + 1}: {record.makespan_s:.2f} s (phase 1 {phase1:.2f} s, "
                     f"phase 2 {phase2:.2f} s), {record.tokens_per_s:.1f} tok/s, capped {record.capped}, "
                     f"peak {record.peak_mb:.0f} MB")
        release_freed_memory()
    baseline = by_mode.get("autoregressive", [])
    for name in names:
        comparable = MODES[name].kind == "engine" or temperature == 0
        for record, reference in zip(by_mode[name], baseline):
            # over the samples this mode ran (transformers+pld runs a subset)
            record.differing = sum(v != reference.outputs.get(k) for k, v in record.outputs.items()) \
                if comparable else None
            if name != "autoregressive":
                progress(f"  {name} epoch {record.epoch + 1}: differing from autoregressive {record.differing}")
    return {name: by_mode[name] for name in names}


def events_name(mode: str, temperature: float, repeat: int = 0) -> str:
    """The event log of a mode's run: ``events-MODE-T1.jsonl`` for the first repeat, ``-r2`` on for
    the later ones."""
    return f"events-{mode.replace(' ', '-')}-T{temperature:g}" + (f"-r{repeat + 1}" if repeat else "") + ".jsonl"


def repeat_order(names: Sequence[str], repeat: int) -> list[str]:
    """The order of the modes in 0-based ``repeat``: every second one last to first, so that
    what a run inherits from the one before it (memory just freed, a machine still settling)
    falls on every mode alike. The bench scripts under bench/ interleave by the same rule."""
    return list(names[::-1] if repeat % 2 else names)


def median_runs(repeats: list[dict[str, list[RunRecord]]]) -> dict[str, list[RunRecord]]:
    """Per mode and epoch, the repeat whose makespan is the median (the lower one of an even
    count): a whole run, so its phases still add up to its makespan. Its ``differing`` is the
    most any repeat had: one differing sample anywhere must show."""
    out: dict[str, list[RunRecord]] = {}
    for name in repeats[0]:
        epochs = []
        for epoch in range(len(repeats[0][name])):
            runs = sorted((r[name][epoch] for r in repeats if name in r), key=lambda rec: rec.makespan_s)
            chosen = runs[(len(runs) - 1) // 2]
            differing = [r.differing for r in runs if r.differing is not None]
            chosen.differing = max(differing) if differing else None
            epochs.append(chosen)
        out[name] = epochs
    return out


def record_repeats(repeats: list[dict[str, list[RunRecord]]], record: RunRecord) -> list[list[float]]:
    """[makespan, autoregressive's makespan in the same repeat] of every repeat of ``record``'s
    mode and epoch, in the order they ran: the paired ratios that the machine's drift spares."""
    pairs = []
    for r in repeats:
        runs, base = r.get(record.mode), r.get("autoregressive")
        if runs and base and record.epoch < len(runs):
            pairs.append([round(runs[record.epoch].makespan_s, 3), round(base[record.epoch].makespan_s, 3)])
    return pairs


def ceiling_cost(engine: EngineConfig) -> CostModel:
    """The cost model the ceilings are simulated on: the one the policy decided on, i.e. this
    machine's cached profile for the engine's backend, model, dtype, device and threads (a vLLM
    verifier's steps cost what vLLM's cost, not our engine's), or the file ``engine.profile``
    names; the packaged one where nothing was measured."""
    from specactor.engine.model_registry import resolve_model
    from specactor.engine.profiling import resolve_profile

    threads = engine.verifier_threads  # None: torch's default, as in the verifier's process
    if threads is None and engine.backend == "vllm":  # vLLM's OpenMP threads (VllmEngine's default)
        threads = int(os.environ.get("OMP_NUM_THREADS") or 0) or os.cpu_count() or 1
    setting = "cached" if engine.profile in (None, "auto") else engine.profile
    path = resolve_profile(setting, resolve_model(engine.model), dtype=engine.dtype, device=engine.device,
                           threads=threads, backend=engine.profile_backend)
    return CostModel.from_profile(path)


def profile_label(source: str) -> str:
    """A profile named for the report without the machine's paths: the packaged one, or the cached
    file's name (it encodes the model, dtype, device and threads)."""
    return source if source == "packaged" else Path(source).name


def temperature_ceilings(by_mode: dict[str, list[RunRecord]], cost: CostModel,
                         max_tokens: int, max_window: int = MAX_WINDOW,
                         prompts: dict[str, list[int]] | None = None) -> list[dict[str, Any]]:
    """One temperature's ceilings per epoch, from the runs of every mode that covered the whole
    workload (a subset run would leave samples without evidence), with windows up to the runs'
    own (``max_window``): a bound held to a smaller window than the policy may use is no bound.
    Given each sample's ``prompts``, also the policy and clairvoyant drafts replayed on
    autoregressive's tokens (:func:`specactor.bench.replay_runs.replay_ceilings`), with the
    replayable drafters the policy's modes ran, earlier epochs' outputs in their history."""
    from specactor.bench.replay_runs import replay_ceilings
    from specactor.bench.replay_learned import LEARNED
    from specactor.bench.replay_workload import REPLAY_METHODS

    # the learned drafter replays from a student trained on the run's epochs, which lives in the
    # run's drafter actor: bench/replay_policy.py --learned trains one to replay
    methods = [m for m in REPLAY_METHODS if m != LEARNED and any(
        m in MODES[name].drafters for name in by_mode if name in MODES and MODES[name].engine_mode == "specactor")]
    history: list[tuple[list[int], list[int]]] = []
    out = []
    for epoch, reference in enumerate(by_mode.get("autoregressive", [])):
        if not reference.samples or reference.makespan_s <= 0:
            continue
        runs = {name: records[epoch].samples for name, records in by_mode.items()
                if epoch < len(records) and not records[epoch].note}
        phase1, phase2 = reference.phases
        out.append({"temperature": reference.temperature, "epoch": epoch, "samples": len(reference.samples),
                    "max_tokens": max_tokens, "capped": reference.capped,
                    "measured_autoregressive": {"makespan_s": reference.makespan_s, "phase1_s": phase1,
                                                "phase2_s": phase2},
                    "tail_share": phase2 / reference.makespan_s,
                    **from_samples(runs, cost, reference.makespan_s, max_window=max_window)})
        if prompts and methods and all(sid in prompts for sid in reference.outputs):
            samples = [(sid, prompts[sid], tokens) for sid, tokens in reference.outputs.items()]
            out[-1]["replayed"] = replay_ceilings(samples, methods, cost, reference.makespan_s, max_window, history,
                                                  max_tokens, reference.temperature == 0)
            history += [(prompt, tokens) for _, prompt, tokens in samples]
    return out


def write_outputs(report: dict[str, Any], out: str | Path) -> list[Path]:
    from specactor.bench.report import markdown, plot

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "suite.json", out / "suite.md"]
    paths[0].write_text(json.dumps(report, indent=1))
    paths[1].write_text(markdown(report))
    try:
        paths.append(plot(report, out / "suite.png"))
    except ImportError:
        pass
    return paths
