"""Named policies on a replayed rollout: the bench's replayed ceilings separate the policy from what
the drafters allow, earlier epochs reach the drafters' history, speedups are against replayed plain
decoding and times calibrated to a measured run, and an unknown policy is named."""

from __future__ import annotations

import random

import pytest

from specactor.bench.replay_runs import ReplaySettings, compare, make_policy, replay_ceilings
from specactor.policy.cost_model import CostModel


def _random_tokens(n: int, seed: int) -> list[int]:
    """Tokens that never repeat an n-gram a drafter could follow (all distinct)."""
    return random.Random(seed).sample(range(1000, 50000), n)


def test_replay_ceilings_separate_the_policy_from_what_the_drafters_allow() -> None:
    """On samples that repeat themselves the drafters' right tokens buy a lot, and the policy takes
    much of it; on samples no drafter can follow there is nothing to buy, and the policy, replayed,
    is not slower than autoregressive. Autoregressive, replayed, takes the measured time."""
    cost = CostModel.from_profile()
    loops = [(f"loop{i}", [1, 2, 3], ([5, 6, 7, 8] * 60)[:120 + 40 * i]) for i in range(4)]
    fresh = [(f"fresh{i}", [1, 2, 3], _random_tokens(120 + 40 * i, i)) for i in range(4)]
    looping = replay_ceilings(loops, ["ngram", "suffix"], cost, measured_autoregressive_s=30.0)
    assert looping["autoregressive"]["makespan_s"] == pytest.approx(30.0)
    assert looping["clairvoyant"]["speedup"] > 2.0
    assert looping["policy"]["speedup"] > 1.5
    unpredictable = replay_ceilings(fresh, ["ngram", "suffix"], cost, measured_autoregressive_s=30.0)
    assert unpredictable["clairvoyant"]["speedup"] == pytest.approx(1.0)
    assert unpredictable["policy"]["speedup"] >= 0.97


def test_earlier_epochs_outputs_are_in_the_drafters_history() -> None:
    """A sample that an earlier epoch produced already is drafted through by the suffix drafter
    from its first token (it matches the history), not only once it repeats itself."""
    cost = CostModel.from_profile()
    samples = [(f"s{i}", [1, 2, 3], _random_tokens(200, i)) for i in range(2)]
    first = replay_ceilings(samples, ["suffix"], cost, measured_autoregressive_s=10.0)
    again = replay_ceilings(samples, ["suffix"], cost, measured_autoregressive_s=10.0,
                            history=[(prompt, output) for _, prompt, output in samples])
    assert first["clairvoyant"]["speedup"] == pytest.approx(1.0)
    assert again["clairvoyant"]["speedup"] > 3.0


def test_compare_puts_plain_first_and_scales_to_a_measured_run() -> None:
    """Every speedup is against replayed plain decoding, phase by phase, and every time is scaled
    by one factor so that plain takes the measured seconds (the speedups do not move)."""
    samples = [(f"s{i}", [1, 2], ([3, 4, 5] * 100)[:60 + 30 * i]) for i in range(4)]
    settings = ReplaySettings(CostModel.from_profile(), seeds=2)
    raw = compare(samples, ["geometric", "perfect"], settings)
    assert list(raw["runs"]) == ["plain", "geometric", "perfect"] and raw["scale"] == 1.0
    scaled = compare(samples, ["perfect", "geometric"], settings, measured_plain_s=2 * raw["runs"]["plain"]["makespan_s"])
    assert scaled["scale"] == pytest.approx(2.0)
    for name in ("geometric", "perfect"):
        row, base = raw["runs"][name], raw["runs"]["plain"]
        assert row["speedup"] == pytest.approx(base["makespan_s"] / row["makespan_s"])
        assert row["phase2_speedup"] == pytest.approx(base["phase2_s"] / row["phase2_s"])
        assert scaled["runs"][name]["speedup"] == pytest.approx(row["speedup"])
        assert scaled["runs"][name]["makespan_s"] == pytest.approx(2 * row["makespan_s"])
        assert len(row["makespans_s"]) == (2 if name == "geometric" else 1)


def test_an_unknown_policy_is_named() -> None:
    settings = ReplaySettings(CostModel.from_profile())
    with pytest.raises(ValueError, match="unknown policy 'fixed:model:4'"):
        make_policy("fixed:model:4", settings)
    assert make_policy("fixed:suffix:4", settings).choice == ("suffix", 4, True)


def test_a_ceiling_takes_the_window_that_pays_where_drafting_binds_the_step() -> None:
    """A flat 5 ms step (a GPU's shape) and 32 samples repeating themselves: clairvoyant drafts of 16
    tokens a row make the drafter, not the verifier, set each step's length; the ceiling runs at the
    best of a few fixed windows, which here is shorter and faster."""
    from pathlib import Path

    from specactor.bench.replay_runs import run

    cost = CostModel.from_profile(Path(__file__).parents[1] / "policy" / "data" / "flat_profile.json")
    loops = [(f"loop{i}", [1, 2, 3], ([5, 6, 7, 8] * 80)[:300]) for i in range(32)]
    settings = ReplaySettings(cost, ["ngram"], 16)
    best = compare(loops, ["clairvoyant"], settings)["runs"]["clairvoyant"]
    at_16 = run(loops, "clairvoyant", settings)
    assert best["window"] < 16 and best["makespan_s"] < 0.9 * at_16["makespan_s"]


def test_a_ceiling_is_never_below_plain_decoding_where_no_drafting_pays(tmp_path) -> None:
    """A policy may always decline to draft, so a ceiling of one is at least plain decoding: on a
    profile where any draft token makes a step dearer than the right tokens save, clairvoyant drafts
    at every window lose, and the ceiling is plain (window 0)."""
    import json
    from dataclasses import replace

    from specactor.bench.replay_runs import run, table_rows

    costly = {"model": "test", "context": 128, "batch_sizes": [1, 8], "chunk_lens": [1, 2, 17],
              "forward_s": [[0.010, 0.030, 0.300], [0.010, 0.030, 0.300]]}
    (tmp_path / "costly.json").write_text(json.dumps(costly))
    cost = CostModel.from_profile(tmp_path / "costly.json")
    g = random.Random(3)
    samples = [(f"s{i}", [1, 2, 3], [g.randrange(50) for _ in range(120)]) for i in range(8)]
    settings = ReplaySettings(cost, ["ngram", "suffix"], 16)
    compared = compare(samples, ["clairvoyant"], settings)["runs"]
    best, plain = compared["clairvoyant"], compared["plain"]
    drafted = [run(samples, "clairvoyant", replace(settings, window=w))["makespan_s"] for w in (1, 2, 16)]
    assert min(drafted) > plain["makespan_s"]  # drafting what is right still costs more than it saves
    assert best["window"] == 0 and best["makespan_s"] == pytest.approx(plain["makespan_s"])
    assert "clairvoyant (no drafting pays)" in "".join(table_rows("x", {"runs": compared}))
