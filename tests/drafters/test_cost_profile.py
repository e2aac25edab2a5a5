"""A model drafter's measured cost per batch size: timed over the grid its slots allow, its
prefill figure beside, cached per machine and drafter, read back by the policy as it was sent."""

from __future__ import annotations

import json

import pytest

from specactor.drafters.cost_profile import (PREFILL, check_draft_table, draft_profile_key, draft_profile_path,
                                             ensure_draft_profile, measure_draft_cost, table_to_stats)
from specactor.drafters.model import ModelDrafter
from specactor.policy.cost_model import CostModel, table_from_stats
from tests.conftest import ours_from_hf, tiny_hf_model


@pytest.fixture(scope="module")
def drafter() -> ModelDrafter:
    return ModelDrafter(ours_from_hf(tiny_hf_model("llama", seed=3)), max_slots=4, max_len=96)


def test_the_grid_stops_at_the_drafters_slots_and_leaves_it_as_it_was(drafter: ModelDrafter) -> None:
    table = measure_draft_cost(drafter, (1, 2, 4, 8), context=24, k=2, repeats=1)
    assert sorted(table) == [PREFILL, 1, 2, 4]  # 8 rows do not fit 4 slots
    assert all(seconds > 0 for seconds in table.values())
    assert not drafter._slot  # every request it started was finished


def test_a_cached_table_is_read_not_measured_again(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                                   drafter: ModelDrafter) -> None:
    monkeypatch.setenv("SPECACTOR_CACHE", str(tmp_path))
    calls = []

    def measure(d) -> dict[int, float]:
        calls.append(d)
        return {PREFILL: 0.001, 1: 0.01, 2: 0.012}

    first = ensure_draft_profile(drafter, "tiny-model", 1, measure=measure)
    again = ensure_draft_profile(drafter, "tiny-model", 1, measure=measure)
    assert first == again == {PREFILL: 0.001, 1: 0.01, 2: 0.012} and len(calls) == 1
    ensure_draft_profile(drafter, "tiny-model", 2, measure=measure)  # other threads: another table
    assert len(calls) == 2


def test_an_unreadable_or_foreign_cached_table_is_measured_again(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                                                 drafter: ModelDrafter) -> None:
    monkeypatch.setenv("SPECACTOR_CACHE", str(tmp_path))
    path = draft_profile_path(draft_profile_key(drafter, "tiny-model", 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    calls = []

    def measure(d) -> dict[int, float]:
        calls.append(d)
        return {1: 0.02}

    for text in ("not json", json.dumps({"key": {"other": 1}, "seconds": {"1": 0.5}}),
                 json.dumps({"key": draft_profile_key(drafter, "tiny-model", 1), "seconds": {"1": -1}})):
        path.write_text(text)
        assert ensure_draft_profile(drafter, "tiny-model", 1, measure=measure) == {1: 0.02}
    assert len(calls) == 3


@pytest.mark.parametrize("table, named", [({}, "no batch size"), ({PREFILL: 0.1}, "no batch size"),
                                          ({-1: 0.1}, "batch size -1"), ({2: 0.0}, "0.0 s at batch 2"),
                                          ({2: float("nan")}, "nan s at batch 2")])
def test_a_bad_table_is_refused_naming_what_is_wrong(table: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        check_draft_table(table, "measured")


def test_the_policy_reads_the_table_as_the_drafter_sent_it() -> None:
    table = {PREFILL: 0.002, 1: 0.007, 2: 0.015, 8: 0.028}
    values = {"rounds": 3.0, "tokens": 12.0, **table_to_stats(table)}
    assert table_from_stats(values) == {1: 0.007, 2: 0.015, 8: 0.028}
    cost = CostModel.from_profile()
    assert cost.adopt_draft_table("model", table_from_stats(values), values["draft_prefill_s"])
    assert not cost.adopt_draft_table("model", table_from_stats(values), values["draft_prefill_s"])
    assert cost.draft_s("model", 2) == pytest.approx(0.015)
    assert cost.first_draft_s("model", 100) == pytest.approx(0.2)


@pytest.mark.parametrize("values", [{"draft_cost_s/x": 0.1}, {"draft_cost_s/0": 0.1}, {"draft_cost_s/2": -0.1}])
def test_a_malformed_table_in_the_stats_is_ignored(values: dict) -> None:
    assert table_from_stats({"draft_cost_s/1": 0.01, **values}) == {}
