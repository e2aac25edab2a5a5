"""``specactor rollout`` end to end, as a user runs it (a subprocess)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from specactor.config import EngineConfig


def _cli(args: list[str], cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPECACTOR_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "specactor", *args], capture_output=True, text=True,
                          env=env, timeout=600)


def test_rollout_writes_the_contract_format(tmp_path: Path, session_cache: Path, tiny_checkpoint: Path) -> None:
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "Say hi.", "id": "greet", "n": 2}\n{"prompt_ids": [1, 9690, 198], "max_tokens": 3}\n')
    out, events = tmp_path / "out.jsonl", tmp_path / "events.jsonl"
    run = _cli(["rollout", "--prompts", str(prompts), "--out", str(out), "--max-tokens", "6", "--model",
                str(tiny_checkpoint), "--temperature", "1.0", "--seed", "11", "--events", str(events)], session_cache)
    assert run.returncode == 0, run.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["id"], x["sample"]) for x in lines] == [("greet", 0), ("greet", 1), ("1", 0)]
    for line in lines:
        assert set(line) >= {"id", "sample", "prompt_ids", "token_ids", "logprobs", "finish_reason", "text", "stats"}
        assert len(line["token_ids"]) == len(line["logprobs"]) <= 6
        assert all(lp <= 0 for lp in line["logprobs"])
        assert line["finish_reason"] in ("stop", "length")
        assert {"drafted", "accepted", "verify_steps", "per_method"} <= set(line["stats"])
    assert len(lines[2]["token_ids"]) <= 3
    assert "tokens/s" in run.stderr  # the summary table
    names = {json.loads(x)["event"] for x in events.read_text().splitlines()}
    # one path for every mode: the autoregressive baseline is the verifier actor with no drafts
    assert {"verify.step", "request.finished", "rollout.summary"} <= names and "engine.step" not in names
    # same input, same seed: same tokens (seeds derive from --seed, id, sample)
    again = tmp_path / "again.jsonl"
    assert _cli(["rollout", "--prompts", str(prompts), "--out", str(again), "--max-tokens", "6", "--model",
                 str(tiny_checkpoint), "--seed", "11", "--max-batch", "1"], session_cache).returncode == 0
    assert [json.loads(x)["token_ids"] for x in again.read_text().splitlines()] == [x["token_ids"] for x in lines]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompts", "{bad}", "--out", "o.jsonl"], ":1: not a JSON object"),
        (["--prompts", "{ok}", "--out", "o.jsonl", "--top-p", "1.5"], "must be in (0, 1]"),
        (["--prompts", "{ok}", "--out", "o.jsonl", "--max-tokens", "0"], "must be >= 1"),
        (["--prompts", "{ok}", "--out", "o.jsonl", "--model", "/no/such/model"], "does not exist"),
        (["--prompts", "{ok}", "--out", "o.jsonl", "--mode", "fast"], "invalid choice"),
        (["--prompts", "{huge}", "--out", "o.jsonl"], "outside the vocabulary"),
        (["--prompts", "{ok}", "--out", "o.jsonl", "--device", "cuda:99"], "CUDA"),
        (["--prompts", "{ok}", "--out", "o.jsonl", "--device", "tpu"], "choose cpu, cuda or cuda:N"),
        (["--prompts", "{ok}", "--out", "o.jsonl", "--dtype", "float16"], "invalid choice"),
    ],
)
def test_rollout_errors_are_clear(tmp_path: Path, session_cache: Path, args: list[str], message: str) -> None:
    files = {"{bad}": "this is not json\n", "{ok}": '{"prompt": "hi"}\n', "{huge}": '{"prompt_ids": [10000000]}\n'}
    for i, a in enumerate(args):
        if a in files:
            path = tmp_path / "in.jsonl"
            path.write_text(files[a])
            args[i] = str(path)
    run = _cli(["rollout", *args], session_cache)
    assert run.returncode == 2
    assert message in run.stderr, run.stderr


def test_help_explains_the_command() -> None:
    run = subprocess.run([sys.executable, "-m", "specactor", "rollout", "--help"], capture_output=True, text=True)
    assert run.returncode == 0
    for flag in ("--prompts", "--out", "--model", "--mode", "--drafters", "--temperature", "--top-p", "--top-k",
                 "--max-tokens", "--n", "--seed", "--events"):
        assert flag in run.stdout


@pytest.mark.parametrize("command", ["rollout", "serve", "bench"])
def test_help_shows_defaults_but_never_none(command: str) -> None:
    """Options resolved later (per backend or mode) say how in their help; argparse's
    "(default: None)" beside that would contradict it."""
    run = subprocess.run([sys.executable, "-m", "specactor", command, "--help"], capture_output=True, text=True)
    assert run.returncode == 0
    assert "(default: None)" not in run.stdout and "(default: " in run.stdout


def test_kv_cache_that_cannot_fit_is_refused_up_front(default_model) -> None:
    from specactor.cli.rollout import check_kv_memory

    _, model, _ = default_model
    check_kv_memory(model.cfg, 4, 512)
    with pytest.raises(ValueError, match="lower --max-batch or --max-tokens"):
        check_kv_memory(model.cfg, 10_000, 100_000)


def _rollout_lines(tmp_path: Path, checkpoint: Path, cache: Path, name: str, *flags: str) -> list[dict]:
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt_ids": [1, 9690, 198, 2683], "id": "a", "n": 2}\n')
    out, events = tmp_path / f"{name}.jsonl", tmp_path / f"{name}-events.jsonl"
    run = _cli(["rollout", "--prompts", str(prompts), "--out", str(out), "--model", str(checkpoint), "--max-tokens",
                "12", "--events", str(events), *flags], cache)
    assert run.returncode == 0, run.stderr
    summary = next(e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "rollout.summary")
    return [summary, *map(json.loads, out.read_text().splitlines())]


def test_engine_flags_reach_the_verifier_process(tmp_path: Path, tiny_checkpoint: Path, session_cache: Path) -> None:
    """--threads once stopped short of the verifier in the speculative modes; --dtype had no flag."""
    fp32 = _rollout_lines(tmp_path, tiny_checkpoint, session_cache, "fp32", "--mode", "specactor", "--threads", "1")
    bf16 = _rollout_lines(tmp_path, tiny_checkpoint, session_cache, "bf16", "--mode", "specactor", "--threads", "1",
                          "--dtype", "bfloat16")
    # as the verifier process reports them (torch's default here is every core, so 1 is not it by chance)
    assert fp32[0]["verifier_threads"] == 1 and fp32[0]["verifier_dtype"] == "float32"
    assert bf16[0]["verifier_dtype"] == "bfloat16"
    # the verifier really computes in bfloat16: the same tokens' log-probs move
    deltas = [abs(a - b) for x, y in zip(fp32[1:], bf16[1:]) for a, b in zip(x["logprobs"], y["logprobs"])]
    assert deltas and max(deltas) > 1e-3


def test_rollout_never_loads_the_model_in_its_own_process(tmp_path: Path, tiny_checkpoint: Path,
                                                          session_cache: Path, monkeypatch) -> None:
    """The verifier's process holds the model; the rollout's holds only the tokenizer."""
    import specactor.engine.weights as weights
    from specactor.config import EngineConfig
    from specactor.cli.rollout import RolloutOptions, run_rollout

    def forbidden(*args, **kwargs):
        raise AssertionError("the rollout process loaded the model")

    monkeypatch.setattr(weights, "load_causal_lm", forbidden)
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt_ids": [1, 9690, 198]}\n')
    summary = run_rollout(RolloutOptions(str(prompts), str(tmp_path / "out.jsonl"), max_tokens=4, progress=False,
                                         engine=EngineConfig(model=str(tiny_checkpoint), mode="autoregressive")))
    assert summary["samples"] == 1 and summary["output_tokens"] >= 1


def _engine_config_of(command: str, args: list[str], monkeypatch) -> EngineConfig:
    """The EngineConfig that ``specactor COMMAND ARGS`` hands its run, through the command's own
    handler, with the run itself replaced by a recorder."""
    import specactor.bench.suite
    import specactor.cli.rollout
    import specactor.cli.serve
    from specactor.cli.main import main

    seen = []
    monkeypatch.setattr(specactor.cli.rollout, "run_rollout", lambda opts: seen.append(opts.engine))
    monkeypatch.setattr(specactor.cli.serve, "run_daemon", lambda opts: seen.append(opts.engine) or 0)
    monkeypatch.setattr(specactor.bench.suite, "run_suite", lambda opts, progress: seen.append(opts.engine) or 1 / 0)
    with pytest.raises(ZeroDivisionError) if command == "bench" else contextlib.nullcontext():
        main([command, *args])
    (config,) = seen
    return config


@pytest.mark.parametrize("command", ["rollout", "serve", "bench"])
def test_every_command_hands_its_flags_to_the_engine_config(command: str, monkeypatch) -> None:
    """Through each command's own handler, with the run itself replaced by a recorder."""
    from specactor.vllm_backend import require_vllm

    try:
        backend = require_vllm() and "vllm"  # the flag is checked against what is installed
    except RuntimeError:
        backend = "torch"
    flags = ["--model", "m", "--threads", "3", "--dtype", "bfloat16", "--device", "cpu", "--k", "2", "--window", "5",
             "--max-batch", "7", "--no-racing", "--no-share-prompts", "--eager", "--backend", backend]
    if command != "bench":
        flags += ["--mode", "coupled", "--drafters", "suffix", "--seed", "5"]
    required = {"rollout": ["--prompts", "p", "--out", "o"], "serve": ["--max-len", "300"], "bench": []}[command]
    config = _engine_config_of(command, [*required, *flags], monkeypatch)
    assert (config.model, config.verifier_threads, config.dtype, config.device, config.k, config.window,
            config.max_batch, config.racing, config.backend) == ("m", 3, "bfloat16", "cpu", 2, 5, 7, False, backend)
    assert config.share_prompts is False and config.cuda_graphs is False
    if command != "bench":
        assert (config.mode, config.drafters, config.seed) == ("coupled", ["suffix"], 5)
    if command == "serve":
        assert config.max_len == 300


def test_a_rollout_with_failed_samples_keeps_the_old_output(tmp_path: Path, tiny_checkpoint: Path,
                                                            session_cache: Path, monkeypatch) -> None:
    """Failed samples: OUT stays as it was, every line goes to OUT.failed.jsonl, the error is named."""
    import specactor.cli.rollout as rollout
    from specactor.config import EngineConfig
    from specactor.protocol import FinishReason

    real = rollout._generate

    async def one_fails(config, jobs, progress, keep, *rest):
        def keep_failing(result, latency_s):
            keep(replace_result(result) if result.request_id == "a#1" else result, latency_s)

        return await real(config, jobs, progress, keep_failing, *rest)

    def replace_result(result):
        import msgspec

        return msgspec.structs.replace(result, finish_reason=FinishReason.ERROR, error="verifier down: test")

    monkeypatch.setattr(rollout, "_generate", one_fails)
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    prompts, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    prompts.write_text('{"prompt_ids": [1, 9690, 198], "id": "a", "n": 2}\n')
    out.write_text("an earlier good rollout\n")
    with pytest.raises(ValueError, match=r"1 of 2 samples failed .*out.failed.jsonl.*a#1: verifier down: test.*"
                                         r"--resume"):
        rollout.run_rollout(rollout.RolloutOptions(str(prompts), str(out), max_tokens=4, progress=False,
                                                   engine=EngineConfig(model=str(tiny_checkpoint),
                                                                       mode="autoregressive")))
    assert out.read_text() == "an earlier good rollout\n"
    lines = [json.loads(x) for x in (tmp_path / "out.failed.jsonl").read_text().splitlines()]
    assert [x["finish_reason"] for x in lines] == ["length", "error"] and lines[1]["error"] == "verifier down: test"


def test_resume_generates_only_the_missing_samples_and_they_are_the_same(tmp_path: Path, tiny_checkpoint: Path,
                                                                         session_cache: Path, monkeypatch) -> None:
    """An interrupted run: its finished samples are in OUT.partial.jsonl (the last line cut short by
    the interruption); --resume generates only the others, and OUT ends up identical to an
    uninterrupted run's."""
    import specactor.cli.rollout as rollout
    from specactor.config import EngineConfig

    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt_ids": [1, 9690, 198], "id": "a", "n": 3}\n{"prompt_ids": [1, 44, 45], "id": "b"}\n')

    def run(out: Path, resume: bool) -> dict:
        return rollout.run_rollout(rollout.RolloutOptions(
            str(prompts), str(out), max_tokens=6, progress=False, resume=resume,
            engine=EngineConfig(model=str(tiny_checkpoint), mode="autoregressive")))

    whole = tmp_path / "whole.jsonl"
    assert run(whole, False)["samples"] == 4
    reference = [json.loads(x) for x in whole.read_text().splitlines()]
    out = tmp_path / "out.jsonl"
    partial = tmp_path / "out.partial.jsonl"
    kept = [reference[3], reference[1]]  # b#0 and a#1 finished before the interruption
    partial.write_text("".join(json.dumps(x) + "\n" for x in kept) + json.dumps(reference[0])[:25])
    summary = run(out, True)
    assert summary["resumed"] == 2 and summary["samples"] == 4 and not partial.exists()
    resumed = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["id"], x["sample"]) for x in resumed] == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    assert [x["token_ids"] for x in resumed] == [x["token_ids"] for x in reference]
    assert run(out, True)["resumed"] == 4  # everything is there: nothing to generate, OUT unchanged
    assert [json.loads(x)["token_ids"] for x in out.read_text().splitlines()] == [x["token_ids"] for x in reference]
    prompts.write_text('{"prompt_ids": [1, 2, 3], "id": "a", "n": 3}\n{"prompt_ids": [1, 44, 45], "id": "b"}\n')
    with pytest.raises(ValueError, match="has another prompt than this run's"):
        run(out, True)


@pytest.mark.parametrize("command", ["rollout", "serve", "bench"])
def test_a_command_without_engine_flags_gets_the_api_s_defaults(command: str, monkeypatch) -> None:
    """The command line and the Python API must decode alike: a flag's default is EngineConfig's."""
    required = {"rollout": ["--prompts", "p", "--out", "o"], "serve": [], "bench": []}[command]
    config = _engine_config_of(command, required, monkeypatch)
    from specactor.config import EngineConfig

    api = EngineConfig()
    assert (config.k, config.window, config.max_window, config.max_batch, config.racing, config.backend,
            config.share_prompts) == (api.k, api.window, api.max_window, api.max_batch, api.racing, api.backend, True)


def test_the_window_defaults_to_the_backend_s_and_a_given_one_is_kept() -> None:
    """16 on our engine, 8 on vLLM (measured: longer windows cost there at batch 64); resolved
    when read, so a config copied with another backend gets that backend's."""
    from dataclasses import replace

    from specactor.config import VLLM_WINDOW, EngineConfig
    from specactor.speculation import DEFAULT_WINDOW

    assert EngineConfig().max_window == DEFAULT_WINDOW == 16
    assert EngineConfig(backend="vllm").max_window == VLLM_WINDOW == 8
    assert replace(EngineConfig(), backend="vllm").max_window == VLLM_WINDOW
    assert EngineConfig(backend="vllm", window=12).max_window == 12 and EngineConfig(window=3).max_window == 3
    with pytest.raises(ValueError, match="k <= window"):
        EngineConfig(backend="vllm", k=9).check()
