"""The router's rules hold for any sequence of groups and loads."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import pytest

from specactor.pool.router import Router


def test_a_pool_needs_a_replica() -> None:
    with pytest.raises(ValueError, match="at least one replica"):
        Router(0)


def test_no_live_replica_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="no replica"):
        Router(2).route("g", 10, live=[])


@settings(max_examples=200, deadline=None)
@given(replicas=st.integers(1, 6),
       calls=st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(1, 500), st.booleans()), max_size=60))
def test_groups_stick_and_new_groups_go_to_the_least_loaded(replicas: int, calls: list[tuple[str, int, bool]]) -> None:
    router = Router(replicas)
    placed: dict[str, int] = {}
    load = [0] * replicas
    for group, tokens, finish in calls:
        before = list(router.outstanding)
        replica = router.route(group, tokens, live=range(replicas))
        if group in placed:
            assert replica == placed[group]  # sticky: a group seen before goes back
        else:
            assert before[replica] == min(before)  # least outstanding tokens
            assert replica == before.index(min(before))  # ties to the lowest index
        placed[group] = replica
        load[replica] += tokens
        if finish:
            router.finished(replica, tokens)
            load[replica] -= tokens
        assert router.outstanding == load


def test_a_group_whose_replica_is_gone_moves_and_stays_there() -> None:
    router = Router(3)
    assert router.route("g", 100, live=[0, 1, 2]) == 0
    router.forget(0)
    moved = router.route("g", 100, live=[1, 2])
    assert moved == 1
    assert router.route("g", 100, live=[0, 1, 2]) == 1  # sticky to where it went


def test_the_sticky_table_is_bounded() -> None:
    router = Router(2, max_sticky=3)
    for i in range(10):
        router.route(f"g{i}", 1, live=[0, 1])
    assert list(router.sticky) == ["g7", "g8", "g9"]
