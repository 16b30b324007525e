"""The pure decisions of one pass over a pool: scale, rotation within maxUnavailable, rollback, demand."""

from __future__ import annotations

from service.pools.memory import Observed, PoolMemory
from service.pools.plan import decide
from tests.pools.pools import Signals, member, pool

HOUR = 3600.0


def test_empty_pool_creates_its_spread() -> None:
    d = decide(pool(replicas=6), members=[], memory=PoolMemory(), now=0, observe=None)
    assert sorted(d.create) == [("a", None)] * 3 + [("b", None)] * 3


def test_scale_down_without_signals_deletes_oldest_at_once() -> None:
    p = pool(replicas=2)
    ms = [member(p, f"eu-{i}", placement="a" if i < 3 else "b", born=i) for i in range(4)]
    d = decide(p, members=ms, memory=PoolMemory(), now=10, observe=None)
    assert d.delete == ["eu-0", "eu-1"]
    assert d.drain == []
    assert d.create == []


def test_scale_down_with_signals_drains_first_then_deletes_when_leases_end() -> None:
    p = pool(replicas=1, providers=("a",))
    ms = [member(p, "eu-old", born=0), member(p, "eu-new", born=5)]
    memory, signals = PoolMemory(), Signals({"eu-old": Observed(healthy=True, leases_end=100)})
    first = decide(p, members=ms, memory=memory, now=10, observe=signals)
    assert first.drain == ["eu-old"]
    assert first.delete == []
    assert decide(p, members=ms, memory=memory, now=50, observe=signals).delete == []
    assert decide(p, members=ms, memory=memory, now=100, observe=signals).delete == ["eu-old"]


def test_drain_timeout_cuts_long_leases() -> None:
    p = pool(replicas=1, providers=("a",), rotation={"drainTimeout": "60s"})
    ms = [member(p, "eu-old", born=0), member(p, "eu-new", born=5)]
    memory, signals = PoolMemory(), Signals({"eu-old": Observed(healthy=True, leases_end=10_000)})
    decide(p, members=ms, memory=memory, now=10, observe=signals)
    assert decide(p, members=ms, memory=memory, now=70, observe=signals).delete == ["eu-old"]


def test_max_age_replaces_one_at_a_time_oldest_first() -> None:
    p = pool(replicas=3, providers=("a",), rotation={"maxAge": "1h"})
    ms = [member(p, f"eu-{i}", born=i) for i in range(3)]
    d = decide(p, members=ms, memory=PoolMemory(), now=2 * HOUR, observe=Signals())
    assert d.create == [("a", "eu-0")]


def test_replacement_in_flight_blocks_the_next_one() -> None:
    p = pool(replicas=3, providers=("a",), rotation={"maxAge": "1h"})
    ms = [member(p, f"eu-{i}", born=i) for i in range(3)]
    ms.append(member(p, "eu-r0", born=2 * HOUR, replaces="eu-0"))
    signals = Signals({"eu-r0": Observed(healthy=None)})
    d = decide(p, members=ms, memory=PoolMemory(), now=2 * HOUR + 1, observe=signals)
    assert d.create == []
    assert d.drain == []
    assert d.delete == []


def test_healthy_replacement_drains_the_old_one() -> None:
    p = pool(replicas=3, providers=("a",), rotation={"maxAge": "1h"})
    ms = [member(p, f"eu-{i}", born=i) for i in range(3)]
    ms.append(member(p, "eu-r0", born=2 * HOUR, replaces="eu-0"))
    memory, signals = PoolMemory(), Signals({"eu-0": Observed(healthy=True, leases_end=2 * HOUR + 30)})
    d = decide(p, members=ms, memory=memory, now=2 * HOUR + 1, observe=signals)
    assert d.drain == ["eu-0"]
    assert d.create == []
    d = decide(p, members=ms, memory=memory, now=2 * HOUR + 30, observe=signals)
    assert d.delete == ["eu-0"]
    assert d.create == []


def test_max_unavailable_two_starts_two() -> None:
    p = pool(replicas=4, providers=("a",), rotation={"maxAge": "1h", "maxUnavailable": "50%"})
    ms = [member(p, f"eu-{i}", born=i) for i in range(4)]
    d = decide(p, members=ms, memory=PoolMemory(), now=2 * HOUR, observe=Signals())
    assert d.create == [("a", "eu-0"), ("a", "eu-1")]


def test_bans_from_distinct_clients_come_before_age() -> None:
    p = pool(replicas=2, providers=("a",), rotation={"maxAge": "1h", "replaceAfterBans": {"count": 2}})
    ms = [member(p, "eu-old", born=0), member(p, "eu-banned", born=HOUR)]
    signals = Signals({"eu-banned": Observed(healthy=True, ban_clients=2)})
    d = decide(p, members=ms, memory=PoolMemory(), now=2 * HOUR, observe=signals)
    assert d.create == [("a", "eu-banned")]


def test_one_client_is_not_enough() -> None:
    p = pool(replicas=1, providers=("a",), rotation={"replaceAfterBans": {"count": 2}})
    signals = Signals({"eu-x": Observed(healthy=True, ban_clients=1)})
    d = decide(p, members=[member(p, "eu-x")], memory=PoolMemory(), now=10, observe=signals)
    assert d.create == []


def test_replacement_never_healthy_rolls_back_with_backoff_and_degraded() -> None:
    p = pool(replicas=1, providers=("a",), rotation={"maxAge": "1h", "readyTimeout": "5m", "backoff": "1m"})
    old, new = member(p, "eu-old", born=0), member(p, "eu-new", born=HOUR, replaces="eu-old")
    memory, signals = PoolMemory(), Signals({"eu-new": Observed(healthy=False)})
    assert decide(p, members=[old, new], memory=memory, now=HOUR + 299, observe=signals).delete == []
    d = decide(p, members=[old, new], memory=memory, now=HOUR + 300, observe=signals)
    assert d.delete == ["eu-new"]
    assert "rolled back" in memory.degraded["eu-old"]
    assert memory.retry_at["eu-old"] == HOUR + 360
    assert decide(p, members=[old], memory=memory, now=HOUR + 359, observe=signals).create == []
    assert decide(p, members=[old], memory=memory, now=HOUR + 360, observe=signals).create == [
        ("a", "eu-old")
    ]


def test_second_rollback_doubles_the_wait() -> None:
    p = pool(replicas=1, providers=("a",), rotation={"maxAge": "1h", "readyTimeout": "5m", "backoff": "1m"})
    old = member(p, "eu-old", born=0)
    memory, signals = PoolMemory(failures={"eu-old": 1}), Signals({"eu-new": Observed(healthy=False)})
    new = member(p, "eu-new", born=HOUR, replaces="eu-old")
    decide(p, members=[old, new], memory=memory, now=HOUR + 300, observe=signals)
    assert memory.retry_at["eu-old"] == HOUR + 300 + 120


def test_demand_scales_up_within_max_and_down_within_min() -> None:
    p = pool(
        replicas=2,
        providers=("a",),
        minReplicas=1,
        maxReplicas=3,
        demand={"window": "1m", "unmetRequests": 3, "idleWindow": "10m", "idleShare": 0.5},
    )
    ms = [member(p, "eu-1", born=0), member(p, "eu-2", born=0)]
    memory = PoolMemory()
    up = decide(p, members=ms, memory=memory, now=10, observe=Signals(), unmet=3)
    assert up.desired == 3
    assert up.create == [("a", None)]
    again = decide(p, members=ms, memory=memory, now=100, observe=Signals(), unmet=9)
    assert again.desired == 3  # at maxReplicas
    busy = Signals({n: Observed(healthy=True, last_leased=700) for n in ("eu-1", "eu-2")})
    assert decide(p, members=ms, memory=memory, now=710, observe=busy).desired == 3
    down = decide(p, members=ms, memory=memory, now=1300, observe=busy)
    assert down.desired == 2
    later = decide(p, members=ms, memory=memory, now=1899, observe=busy)
    assert later.desired == 2  # one step per idle window
    assert decide(p, members=ms, memory=memory, now=1900, observe=busy).desired == 1
    assert decide(p, members=ms, memory=memory, now=5000, observe=busy).desired == 1  # minReplicas
