"""The probe schedule (service/health/schedule.py): keys in one list per tick, a heap of ticks, in place of a
heap of (due, key) tuples. Every key pushed comes out once: by its due time, never more than a tick before it,
the earliest tick first."""

from __future__ import annotations

import sys
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from service.health.schedule import TICK, Schedule

entries = st.lists(st.tuples(st.floats(0, 100, allow_nan=False), st.sampled_from("abcdef")), max_size=60)
times = st.lists(st.floats(0, 120, allow_nan=False), max_size=12)


@given(pushed=entries, nows=times)
def test_every_key_comes_out_once_by_its_due_time_and_never_a_tick_early(
    pushed: list[tuple[float, str]], nows: list[float]
) -> None:
    schedule = Schedule()
    for due, key in pushed:
        schedule.push(due, key)
    assert len(schedule) == len(pushed)
    waiting = list(pushed)
    for now in [*sorted(nows), 1000.0]:
        out = []
        while (entry := schedule.pop_due(now)) is not None:
            out.append(entry)
        assert [at for at, _ in out] == sorted(at for at, _ in out)  # the earliest tick first
        assert all(at <= now for at, _ in out)
        came = Counter(key for _, key in out)
        must = Counter(key for due, key in waiting if due <= now)  # due: out by now
        may = Counter(key for due, key in waiting if due < now + TICK)  # at most a tick early
        assert must <= came <= may
        for key, count in came.items():  # drop what came out, the earliest due of each key first
            dues = sorted(due for due, k in waiting if k == key)[:count]
            for due in dues:
                waiting.remove((due, key))
    assert not waiting
    assert len(schedule) == 0
    assert schedule.next_due() is None


def test_the_next_due_is_the_earliest_tick_and_a_tick_keeps_all_its_keys() -> None:
    schedule = Schedule()
    schedule.push(10.0, "b")
    schedule.push(5.0, "a")
    schedule.push(10.0 + TICK / 2, "c")
    due = schedule.next_due()
    assert due is not None
    assert 5.0 - TICK < due <= 5.0
    assert schedule.pop_due(5.0 - TICK) is None
    assert schedule.pop_due(5.0) == (due, "a")
    assert schedule.pop_due(9.9) is None
    assert {entry[1] for entry in (schedule.pop_due(10.0), schedule.pop_due(10.0)) if entry} == {"b", "c"}
    assert schedule.pop_due(10.0) is None
    assert schedule.next_due() is None


def test_a_key_costs_a_list_slot_not_a_tuple_and_a_float() -> None:
    schedule = Schedule()
    for i in range(10_000):  # 10,000 proxies due over 10 s: 500 ticks
        schedule.push(1000.0 + i / 1000, sys.intern(f"crawl/p{i}"))
    held = sum(sys.getsizeof(keys) for keys in schedule._buckets.values())
    held += sys.getsizeof(schedule._buckets) + sys.getsizeof(schedule._ticks) + 500 * sys.getsizeof(50_000)
    assert held / 10_000 < 20  # a heap of (due, key) tuples: about 88 bytes a key
