"""The planner's per-stack views: a plan made from what changed since the last one equals a plan worked out
from scratch, whatever the order of upserts, moves, rejections, deletions, releases, applied read-backs and
catalogue changes."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from automation.planner import Planner
from stacks.models import ProviderCatalogue, Proxy
from stacks.spec_hash import stack_spec_hash

NAMES = ("a", "b", "c", "d", "a-b")
NAMESPACES = ("crawl", "crawl-a")  # crawl-a/b and crawl/a-b share a flat name: collisions happen
PROVIDERS = ("one", "two", "three", "missing")


def proxy(namespace: str, name: str, provider: str, port: int, leaving: bool, skip: bool) -> Proxy:
    metadata: dict[str, object] = {"name": name, "namespace": namespace}
    if skip:
        metadata["annotations"] = {"crawl.example.com/skip-cleanup": "true"}
    if leaving:
        metadata["deletionTimestamp"] = datetime(2026, 1, 1, tzinfo=UTC).isoformat()
    spec = {"provider": provider, "port": port, "allowedSourceRanges": ["127.0.0.0/8"]}
    return Proxy.model_validate({"metadata": metadata, "spec": spec})


def catalogue(names: list[str], bind: str) -> ProviderCatalogue:
    return ProviderCatalogue.model_validate(
        {"providers": [{"name": n, "type": "local", "bindAddress": bind} for n in names]}
    )


def summary(planner: Planner, name: str) -> tuple[object, ...]:
    plan = planner.plan(name)
    return (
        plan.entry,
        [(p.key, p.spec_hash, p.packed.proxy.spec.port) for p in plan.proxies],
        [p.key for p in plan.deleting],
        [p.key for p in plan.forget],
        plan.spec_hash,
    )


proxies = st.builds(
    proxy,
    st.sampled_from(NAMESPACES),
    st.sampled_from(NAMES),
    st.sampled_from(PROVIDERS),
    st.integers(1024, 1030),  # a port changes the hashes; the rejections come from providers and names
    st.booleans(),
    st.booleans(),
)


class PlannerViews(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.planner = Planner()
        self.planner.set_catalogue(catalogue(["one", "two", "three"], "127.0.0.1"))

    @rule(given=proxies)
    def upsert(self, given: Proxy) -> None:
        self.planner.upsert(given)

    @rule(namespace=st.sampled_from(NAMESPACES), name=st.sampled_from(NAMES))
    def remove(self, namespace: str, name: str) -> None:
        self.planner.remove(f"{namespace}/{name}")

    @rule(namespace=st.sampled_from(NAMESPACES), name=st.sampled_from(NAMES))
    def release(self, namespace: str, name: str) -> None:
        current = self.planner.current(f"{namespace}/{name}")
        if current is not None:
            self.planner.release(current)

    @rule(given=st.lists(proxies, max_size=3))
    def remember_applied(self, given: list[Proxy]) -> None:
        self.planner.remember_applied([p for p in given if p.metadata.deletion_timestamp is None])

    @rule(stack=st.sampled_from(PROVIDERS))
    def mark_applied(self, stack: str) -> None:
        self.planner.mark_applied(self.planner.plan(stack))

    @rule(
        names=st.lists(st.sampled_from(PROVIDERS[:3]), unique=True),
        bind=st.sampled_from(["127.0.0.1", "::1"]),
    )
    def set_catalogue(self, names: list[str], bind: str) -> None:
        self.planner.set_catalogue(catalogue(names, bind))

    @rule(stack=st.sampled_from(PROVIDERS))
    def plan(self, stack: str) -> None:
        self.planner.plan(stack)  # leaves a view behind, which later changes must keep true

    @invariant()
    def every_plan_equals_a_plan_from_scratch(self) -> None:
        kept = {name: summary(self.planner, name) for name in PROVIDERS}
        views = dict(self.planner._views)
        self.planner._views.clear()  # every stack's view built again from the tables
        fresh = {name: summary(self.planner, name) for name in PROVIDERS}
        self.planner._views.update(views)
        assert kept == fresh

    @invariant()
    def every_stack_hash_is_the_hash_of_its_proxies(self) -> None:
        """The stack's text, changed in place proxy by proxy, still gives the hash of the whole document."""
        for name in PROVIDERS:
            plan = self.planner.plan(name)
            if plan.entry is not None:
                hashes = {planned.key: planned.spec_hash for planned in plan.proxies}
                assert plan.spec_hash == stack_spec_hash(plan.entry, hashes)


TestPlannerViews = PlannerViews.TestCase
TestPlannerViews.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


def test_a_changed_port_changes_the_plan_and_its_hash_in_place() -> None:
    planner = Planner()
    planner.set_catalogue(catalogue(["one"], "127.0.0.1"))
    for name in NAMES:
        planner.upsert(proxy("crawl", name, "one", 1024, False, False))
    before = planner.plan("one")
    planner.upsert(proxy("crawl", "b", "one", 1025, False, False))
    after = planner.plan("one")
    assert [p.key for p in after.proxies] == [p.key for p in before.proxies]
    assert after.proxies[2].packed.proxy.spec.port == 1025
    assert after.spec_hash != before.spec_hash
    planner.upsert(proxy("crawl", "b", "one", 1024, False, False))
    assert planner.plan("one").spec_hash == before.spec_hash
