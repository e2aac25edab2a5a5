"""This machine's cost profile: measured on the packed model, cached under a stable key, a cache
hit measures nothing, a corrupt cache file is measured again (a warning, not a crash), and the
engine hands the cached profile to the policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specactor.config import EngineConfig
from specactor.engine import profiling
from specactor.policy.cost_model import CostModel
from specactor.engine.profiling import (QUICK, Grid, ensure_profile, find_profile, grid_for, measure, profile_key,
                                        profile_path, resolve_profile)

TINY_GRID = Grid(batch_sizes=(1, 2, 4), chunk_lens=(1, 2, 4), context=16, repeats=1)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECACTOR_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def model(tiny_checkpoint: Path):
    """A model of its own (profiling packs it; the shared tiny_model stays as it is)."""
    from specactor.engine.weights import load_causal_lm

    return load_causal_lm(tiny_checkpoint)


def _ensure(model, folder: Path, announced: list[str] | None = None, **kwargs) -> Path | None:
    return ensure_profile(model, folder, dtype="float32", device="cpu", threads=1, grid=TINY_GRID,
                          announce=(announced.append if announced is not None else lambda _: None), **kwargs)


def test_the_key_is_stable_and_names_model_setting_and_machine(tiny_checkpoint: Path, cache: Path) -> None:
    key = profile_key(tiny_checkpoint, "float32", "cpu", 1)
    assert key == profile_key(str(tiny_checkpoint), "float32", "cpu", 1) == profile_key(tiny_checkpoint.name,
                                                                                         "float32", "cpu", 1)
    assert key["model"] == tiny_checkpoint.name and key["threads"] == 1 and key["cpu"] and key["torch"]
    path = profile_path(key)
    assert path == profile_path(profile_key(tiny_checkpoint, "float32", "cpu", 1))
    assert path.parent == cache / "profiles" and path.name.startswith(f"{tiny_checkpoint.name}-float32-cpu-t1-")
    others = {profile_path(profile_key(tiny_checkpoint, "bfloat16", "cpu", 1)),
              profile_path(profile_key(tiny_checkpoint, "float32", "cpu", 2)),
              profile_path(profile_key("another-model", "float32", "cpu", 1))}
    assert path not in others and len(others) == 3


def test_measure_times_the_packed_model_in_the_cost_models_format(model, tmp_path: Path) -> None:
    from specactor.engine.prepacked_linear import PackedLinear, packing_available

    packable = packing_available(model.embed.weight)
    profile = measure(model, (1, 2, 4), (1, 2, 4), context=16, repeats=1, sample=True)
    assert profile["packed"] == packable == isinstance(model.lm_head, PackedLinear)  # what the engine runs
    assert profile["batch_sizes"] == [1, 2, 4] and profile["chunk_lens"] == [1, 2, 4]
    for table in ("forward_s", "one_row_s", "half_rows_s", "sample_s"):
        assert [len(row) for row in profile[table]] == [3, 3, 3]
    assert profile["one_row_s"][0] == profile["forward_s"][0]  # at batch 1 the one row is every row
    assert all(one[0] == full[0] for one, full in zip(profile["one_row_s"], profile["forward_s"]))
    # half of 1 or 2 rows is one row; a decode step is a decode step
    assert profile["half_rows_s"][:2] == profile["one_row_s"][:2]
    assert all(half[0] == full[0] for half, full in zip(profile["half_rows_s"], profile["forward_s"]))
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    cost = CostModel.from_profile(path)
    assert cost.one_row_s is not None and cost.verify_rows_s(4, 4 + 3, rows=1) > 0
    assert cost.half_rows_s is not None and cost.at_batch(4).half_rows is not None


def test_half_the_rows_are_timed_fed_the_chunk_the_others_decoding(model, monkeypatch) -> None:
    seen: list[list[int]] = []
    real = type(model).forward

    def spy(self, tokens, q_lens, cache, *args, **kwargs):
        seen.append(list(q_lens))
        return real(self, tokens, q_lens, cache, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", spy)
    measure(model, (8,), (1, 3), context=16, repeats=1)
    assert [3, 3, 3, 3, 1, 1, 1, 1] in seen and [3, 1, 1, 1, 1, 1, 1, 1] in seen and [3] * 8 in seen
    seen.clear()
    measure(model, (8,), (1, 3), context=16, repeats=1, half_rows=False)
    assert [3, 3, 3, 3, 1, 1, 1, 1] not in seen and [3, 1, 1, 1, 1, 1, 1, 1] in seen


def test_a_measured_batch_holds_contexts_of_different_lengths_as_a_rollout_does(model) -> None:
    """Rows of equal length let a batch of decode steps skip the attention mask every live step builds,
    so the profile's decode step came out cheaper than a rollout's (and drafting dearer beside it)."""
    seen: list[list[int]] = []
    real = type(model).forward

    def recording(self, tokens, q_lens, cache, *args, **kwargs):
        seen.append(list(cache.lengths[:len(q_lens)]))
        return real(self, tokens, q_lens, cache, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(model), "forward", recording)
        measure(model, (1, 4), (1, 2), context=16, repeats=1)
    batches = [lengths for lengths in seen if len(lengths) == 4]
    assert batches and all(len(set(lengths)) == 4 for lengths in batches)
    assert all(sum(lengths) / 4 == pytest.approx(16, abs=1) for lengths in batches)
    assert all(lengths == [16] for lengths in seen if len(lengths) == 1)


def test_with_cuda_graphs_the_profile_times_the_padded_steps_and_is_cached_apart(model, tiny_checkpoint: Path,
                                                                                 monkeypatch) -> None:
    """Steps replayed as CUDA graphs are padded to a bucket and cost what a replay costs: the profile
    of a graphed engine times those steps (on a CPU, uncaptured) and is kept under its own key."""
    from specactor.engine import cuda_graphs

    padded: list[tuple[int, int]] = []
    real = cuda_graphs.padded_forward

    def recording(model, tokens, starts, cache, chunk, out=None):
        padded.append((starts.shape[0], chunk))
        return real(model, tokens, starts, cache, chunk, out=out)

    monkeypatch.setattr(cuda_graphs, "padded_forward", recording)
    profile = measure(model, (1, 3), (1, 4), context=16, repeats=1, cuda_graphs=True)
    assert profile["batch_sizes"] == [1, 3] and all(t > 0 for row in profile["forward_s"] for t in row)
    assert {(1, 1), (1, 5), (3, 1), (3, 5)} <= set(padded)  # chunk 4 padded to 5; batch 3 is the largest
    assert EngineConfig(device="cpu").profile_backend == "torch"
    assert EngineConfig(device="cuda", cuda_graphs=False).profile_backend == "torch"
    graphed = EngineConfig(device="cuda").profile_backend
    assert graphed == "torch-cuda-graphs"
    assert profile_path(profile_key(tiny_checkpoint, "float32", "cuda", 1, graphed)) != \
        profile_path(profile_key(tiny_checkpoint, "float32", "cuda", 1))


def test_the_first_call_measures_and_caches_then_the_cache_is_used(model, tiny_checkpoint: Path, cache: Path,
                                                                   events_file, monkeypatch) -> None:
    announced: list[str] = []
    path = _ensure(model, tiny_checkpoint, announced)
    assert path is not None and path.is_file() and path.parent == cache / "profiles"
    assert len(announced) == 1 and "measured the cost profile" in announced[0] and str(path) in announced[0]
    stored = json.loads(path.read_text())
    assert stored["key"] == profile_key(tiny_checkpoint, "float32", "cpu", 1)
    CostModel.from_profile(path)

    def no_measuring(*args, **kwargs):
        raise AssertionError("a cache hit must not measure")

    monkeypatch.setattr(profiling, "measure", no_measuring)
    assert _ensure(model, tiny_checkpoint, announced) == path
    assert len(announced) == 1
    events = [e for e in events_file() if e["event"] == "policy.profile"]
    assert [e["cached"] for e in events] == [False, True]
    assert events[0]["seconds"] > 0 and events[1]["seconds"] == 0 and {e["path"] for e in events} == {str(path)}
    assert find_profile(tiny_checkpoint, "float32", "cpu", 1) == path


def test_another_backends_profile_is_measured_by_its_own_measurer_and_cached_apart(
        model, tiny_checkpoint: Path, cache: Path) -> None:
    """vLLM's steps are profiled through vLLM: its profile never stands for our engine's (nor the
    reverse), and our engine's key is unchanged (profiles cached before stay valid)."""
    ours = _ensure(model, tiny_checkpoint)
    calls = []

    def measurer(engine, *args, **kwargs):
        calls.append(engine)
        return measure(model, *args, **kwargs)

    theirs = _ensure("the vLLM engine", tiny_checkpoint, backend="vllm", measurer=measurer)
    assert calls == ["the vLLM engine"] and theirs is not None and theirs != ours
    assert "backend" not in profile_key(tiny_checkpoint, "float32", "cpu", 1)
    assert json.loads(theirs.read_text())["key"]["backend"] == "vllm"
    assert resolve_profile("auto", tiny_checkpoint, dtype="float32", device="cpu", threads=1, backend="vllm") == str(theirs)
    assert resolve_profile("auto", tiny_checkpoint, dtype="float32", device="cpu", threads=1) == str(ours)
    assert _ensure("the vLLM engine", tiny_checkpoint, backend="vllm", measurer=measurer) == theirs
    assert len(calls) == 1  # cached


def test_a_window_longer_than_the_cached_chunks_is_measured_again_and_a_shorter_one_is_not(
        model, tiny_checkpoint: Path, cache: Path, events_file) -> None:
    """A profile priced chunks up to its grid's longest; a longer window (vLLM's grid takes
    window + 1) would be priced by extrapolation, so it is measured again over the longer grid,
    while a window within the measured chunks keeps the cached file."""
    path = _ensure(model, tiny_checkpoint)
    longer = Grid(batch_sizes=TINY_GRID.batch_sizes, chunk_lens=(1, 2, 4, 6), context=16, repeats=1)
    assert ensure_profile(model, tiny_checkpoint, dtype="float32", device="cpu", threads=1, grid=longer,
                          announce=lambda _: None) == path
    assert json.loads(path.read_text())["chunk_lens"] == [1, 2, 4, 6]
    warnings = [e for e in events_file() if e["event"] == "policy.profile_unusable"]
    assert len(warnings) == 1 and "chunks up to 4" in warnings[0]["error"] and "needs 6" in warnings[0]["error"]
    assert _ensure(model, tiny_checkpoint) == path  # TINY_GRID's chunks are within: the cache is used
    assert json.loads(path.read_text())["chunk_lens"] == [1, 2, 4, 6]
    assert [e["cached"] for e in events_file() if e["event"] == "policy.profile"] == [False, False, True]


@pytest.mark.parametrize("damage", ["not json", "half", "other key", "bad table"])
def test_a_corrupt_cached_profile_is_measured_again_with_a_warning(model, tiny_checkpoint: Path, cache: Path,
                                                                   events_file, damage: str) -> None:
    path = _ensure(model, tiny_checkpoint)
    assert path is not None
    good = json.loads(path.read_text())
    if damage == "not json":
        path.write_text("{this is not json")
    elif damage == "half":
        path.write_text(path.read_text()[: len(path.read_text()) // 2])
    elif damage == "other key":
        path.write_text(json.dumps({**good, "key": {**good["key"], "threads": 99}}))
    else:
        path.write_text(json.dumps({**good, "forward_s": [[0.1]]}))
    assert find_profile(tiny_checkpoint, "float32", "cpu", 1) is None
    assert _ensure(model, tiny_checkpoint) == path
    assert json.loads(path.read_text())["key"] == good["key"]
    CostModel.from_profile(path)
    warnings = [e for e in events_file() if e["event"] == "policy.profile_unusable"]
    assert len(warnings) == 1 and warnings[0]["level"] == "warning" and warnings[0]["path"] == str(path)


def test_without_profiling_a_missing_profile_falls_back_to_the_packaged_one(model, tiny_checkpoint: Path,
                                                                           cache: Path) -> None:
    assert _ensure(model, tiny_checkpoint, measure_missing=False) is None
    assert not (cache / "profiles").exists() or not list((cache / "profiles").glob("*.json"))
    for setting in (None, "auto", "cached"):
        assert resolve_profile(setting, tiny_checkpoint, dtype="float32", device="cpu", threads=1) == "packaged"
    assert CostModel.from_profile("packaged").source == "packaged"
    path = _ensure(model, tiny_checkpoint)
    for setting in (None, "auto", "cached"):
        assert resolve_profile(setting, tiny_checkpoint, dtype="float32", device="cpu", threads=1) == str(path)
    assert resolve_profile(setting, tiny_checkpoint, dtype="float32", device="cpu", threads=2) == "packaged"
    assert resolve_profile("packaged", tiny_checkpoint, dtype="float32", device="cpu", threads=1) == "packaged"
    assert resolve_profile("/some/file.json", tiny_checkpoint, dtype="float32", device="cpu", threads=1) == \
        "/some/file.json"


def test_the_engine_setting_names_what_it_accepts(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("SPECACTOR_PROFILE", raising=False)
    assert EngineConfig().profile is None and EngineConfig().measure_profile
    assert not EngineConfig(profile="cached").measure_profile and not EngineConfig(mode="coupled").measure_profile
    monkeypatch.setenv("SPECACTOR_PROFILE", "packaged")
    assert EngineConfig().profile == "packaged" and not EngineConfig().measure_profile
    with pytest.raises(ValueError, match="profile 'nowhere.json': no such file"):
        EngineConfig(profile="nowhere.json").check()
    path = tmp_path / "mine.json"
    path.write_text("{}")
    EngineConfig(profile=str(path)).check()


async def test_the_policy_gets_this_machines_cached_profile(model, tiny_checkpoint: Path, cache: Path,
                                                            events_file) -> None:
    """The verifier runs in this process with torch's threads: the coordinator finds the profile
    cached under the thread count the verifier reports, and the policy decides on it."""
    import torch

    from specactor.rollout_engine import RolloutEngine
    from specactor.protocol import SamplingParams

    path = ensure_profile(model, tiny_checkpoint, threads=torch.get_num_threads(), grid=TINY_GRID,
                          announce=lambda _: None)
    config = EngineConfig(model=str(tiny_checkpoint), mode="specactor", drafters=["ngram"], transport="inproc",
                          processes=False, max_batch=2, max_len=64, profile=None, window=3, k=3)  # chunk 4: cached
    async with RolloutEngine(config) as engine:
        await engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4, seed=0))
    used = [e for e in events_file() if e["event"] == "policy.profile" and e.get("actor") == "policy"]
    assert [e["path"] for e in used] == [str(path)]


def test_the_start_up_grid_measures_the_window_s_own_chunk() -> None:
    """The longest chunk a verify step feeds a row (window + 1) is timed, not extrapolated from
    chunk 8; nothing longer is asked for (vLLM cannot verify it)."""
    assert grid_for(16).chunk_lens == (1, 2, 4, 8, 17)
    assert grid_for(8).chunk_lens == (1, 2, 4, 8, 9)
    assert grid_for(3).chunk_lens == (1, 2, 4)
    assert grid_for(0).chunk_lens == (1,)  # autoregressive: decode steps only
    assert grid_for(16).batch_sizes == QUICK.batch_sizes


async def test_our_engine_s_verifier_measures_its_window_s_chunk(model, tiny_checkpoint: Path, cache: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """On our engine as on vLLM, a window longer than the cached profile's chunks is measured again
    at start-up, up to window + 1 tokens a row."""
    import torch

    from specactor.rollout_engine import RolloutEngine
    from specactor.engine import profiling
    from specactor.protocol import SamplingParams

    cached = ensure_profile(model, tiny_checkpoint, threads=torch.get_num_threads(), grid=TINY_GRID,
                            announce=lambda _: None)
    assert json.loads(cached.read_text())["chunk_lens"] == [1, 2, 4]  # too short for window 5
    grids = []
    real = profiling.measure

    def small(model, batch_sizes, chunk_lens, context, repeats, **kwargs):
        grids.append(tuple(chunk_lens))
        return real(model, (1, 2), chunk_lens, 16, 1, **kwargs)

    monkeypatch.setattr(profiling, "measure", small)
    config = EngineConfig(model=str(tiny_checkpoint), mode="specactor", drafters=["ngram"], transport="inproc",
                          processes=False, max_batch=2, max_len=64, profile=None, window=5)
    async with RolloutEngine(config) as engine:
        await engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4, seed=0))
    assert grids == [(1, 2, 4, 6)]  # measured again, over the window's chunk
    path = find_profile(tiny_checkpoint, "float32", "cpu", torch.get_num_threads())
    assert path == cached and json.loads(path.read_text())["chunk_lens"] == [1, 2, 4, 6]


def test_a_profile_measured_while_the_machine_was_busy_is_told_apart() -> None:
    """A 2-core machine's cached profile said 226 ms for a batch-32 decode step that takes 58: the
    policy drafted on nearly every batch-32 step by it (0.89x). Such a jump is refused, and the
    real profiles of this project's machines pass."""
    from specactor.engine.profiling import ProfileTables, check_profile_data, implausible

    quiet = ProfileTables([1, 16, 32], [1, 2, 4], [[0.020, 0.021, 0.020], [0.039, 0.056, 0.081],
                                                    [0.062, 0.096, 0.147]])
    assert implausible(quiet) == ""
    busy_batch = ProfileTables([1, 16, 32], [1, 2, 4], [[0.020, 0.021, 0.020], [0.041, 0.057, 0.086],
                                                         [0.226, 0.256, 0.159]])
    assert "batch 32" in implausible(busy_batch)
    busy_chunk = ProfileTables([1, 16, 32], [1, 2, 4], [[0.020, 0.021, 0.020], [0.041, 0.057, 0.086],
                                                         [0.062, 0.096, 0.700]])
    assert "700.0 ms" in implausible(busy_chunk)
    # a tiny model's sub-millisecond noise is not load: 0.7 ms at batch 1, 3.0 at batch 2
    assert implausible(ProfileTables([1, 2], [1, 2], [[0.0004, 0.0007], [0.0005, 0.0030]])) == ""
    root = Path(__file__).resolve().parents[2]
    for path in [root / "specactor" / "policy" / "default_profile.json",
                 *(root / "bench" / "results" / "gpu" / "profiles").glob("*.json"),
                 *(root / "bench" / "results" / "policy" / "profiles").glob("*.json")]:
        assert implausible(check_profile_data(json.loads(path.read_text()), str(path))) == "", path
