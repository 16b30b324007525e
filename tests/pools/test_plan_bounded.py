"""Issue 17 item 5: a scale-down and a placement change stay within maxUnavailable (make-before-break),
and a placement naming a provider the catalogue lacks holds the pool (nothing created, drained, deleted)."""

from __future__ import annotations

from service.pools.memory import Observed, PoolMemory
from service.pools.plan import decide
from service.pools.status import pool_status
from stacks.models import ProviderCatalogue
from tests.pools.pools import Signals, member, pool


def test_scale_down_removes_one_child_per_step_and_can_be_reverted() -> None:
    """8 -> 3 with maxUnavailable 1: one child drained, then deleted, and the next one only once the
    first is gone for good (its deletion finished): a mistaken scale-down can be reverted midway."""
    eight = pool(replicas=8, providers=("a",), rotation={"maxUnavailable": "1"})
    ms = [member(eight, f"eu-{i}", born=i) for i in range(8)]
    three = pool(replicas=3, providers=("a",), rotation={"maxUnavailable": "1"})
    memory, signals = PoolMemory(), Signals()
    first = decide(three, members=ms, memory=memory, now=10, observe=signals)
    assert first.drain == ["eu-0"], "one child at a time"
    assert first.delete == []
    second = decide(three, members=ms, memory=memory, now=11, observe=signals)
    assert second.delete == ["eu-0"]  # no leases: the drain ends at once
    assert second.drain == []
    rest = ms[1:]
    leaving = decide(three, members=rest, memory=memory, now=12, observe=signals, leaving=["eu-0"])
    assert leaving.drain == [], "the next waits until eu-0's deletion finished"
    assert leaving.delete == []
    nxt = decide(three, members=rest, memory=memory, now=13, observe=signals)
    assert nxt.drain == ["eu-1"]
    # Reverted to 8 midway: eu-0 is gone and eu-1 leaving, so two children are made; nothing else goes.
    back = decide(eight, members=rest, memory=memory, now=14, observe=signals)
    assert back.create == [("a", None)] * 2
    assert back.drain == []


def test_scale_down_without_signals_still_goes_at_once() -> None:
    p = pool(replicas=1, providers=("a",))
    ms = [member(p, f"eu-{i}", born=i) for i in range(4)]
    d = decide(p, members=ms, memory=PoolMemory(), now=10, observe=None)
    assert d.delete == ["eu-0", "eu-1", "eu-2"]


def test_placement_change_makes_new_children_before_old_ones_go() -> None:
    """a+b (2+2) -> a+c: one child on c replaces one on b (maxUnavailable 1); b's children are drained
    only once their replacement is healthy, one pair at a time."""
    before = pool(replicas=4, providers=("a", "b"))
    ms = [member(before, f"eu-{p}{i}", placement=p, born=i) for p in "ab" for i in range(2)]
    after = pool(replicas=4, providers=("a", "c"))
    memory = PoolMemory()
    first = decide(after, members=ms, memory=memory, now=10, observe=Signals())
    assert first.create == [("c", "eu-b0")]
    assert first.drain == [], "nothing leaves before its replacement serves"
    assert first.delete == []
    fresh = member(after, "eu-c0", placement="c", born=10, replaces="eu-b0")
    with_new = [*ms, fresh]
    waiting = Signals({"eu-c0": Observed(healthy=None)})
    d = decide(after, members=with_new, memory=memory, now=11, observe=waiting)
    assert (d.create, d.drain, d.delete) == ([], [], []), "one move at a time, none drained yet"
    d = decide(after, members=with_new, memory=memory, now=12, observe=Signals())
    assert d.drain == ["eu-b0"]
    assert d.create == []


def test_scale_up_is_not_bounded() -> None:
    p = pool(replicas=5, providers=("a",), rotation={"maxUnavailable": "1"})
    d = decide(p, members=[member(p, "eu-0")], memory=PoolMemory(), now=1, observe=Signals())
    assert d.create == [("a", None)] * 4


CATALOGUE = ProviderCatalogue.model_validate(
    {"providers": [{"name": "a", "type": "local"}, {"name": "b", "type": "local"}]}
)


def test_an_unknown_provider_holds_the_pool_and_says_how_to_fix_it() -> None:
    from service.pools.hold import unknown_providers

    before = pool(replicas=4, providers=("a", "b"))
    ms = [member(before, f"eu-{p}{i}", placement=p, born=i) for p in "ab" for i in range(2)]
    typo = pool(replicas=4, providers=("a", "bb"))
    held = unknown_providers(typo, CATALOGUE)
    assert held is not None
    assert "spec.placement[1] names provider 'bb'" in held
    assert "known: a, b" in held
    assert unknown_providers(before, CATALOGUE) is None
    memory = PoolMemory()
    d = decide(typo, members=ms, memory=memory, now=10, observe=Signals(), held=held)
    assert (d.create, d.drain, d.delete) == ([], [], [])
    status = pool_status(typo, members=ms, memory=memory, desired=d.desired, healthy=None, held=held)
    degraded = next(c for c in status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "UnknownProvider")
    assert "'bb'" in degraded.message
