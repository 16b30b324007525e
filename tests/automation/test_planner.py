"""The planner's placement rules: held proxies stay where they run, releases never drop a restored proxy,
physical names never collide."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from automation.errors import InvalidInputError
from automation.planner import Planner
from stacks.models import ProviderCatalogue, Proxy
from tests.automation.standin_engine import Backend, RecordingEngine, StackState


def proxy(name: str, *, namespace: str = "crawl", provider: str = "local", port: int = 3128) -> Proxy:
    return Proxy.model_validate(
        {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"provider": provider, "port": port, "allowedSourceRanges": ["127.0.0.0/8"]},
        }
    )


def catalogue(*names: str) -> ProviderCatalogue:
    return ProviderCatalogue.model_validate({"providers": [{"name": n, "type": "local"} for n in names]})


def deleting(p: Proxy) -> Proxy:
    leaving = p.model_copy(deep=True)
    leaving.metadata.deletion_timestamp = datetime(2026, 1, 1, tzinfo=UTC)
    return leaving


def keys(planner: Planner, stack: str) -> list[str]:
    return [planned.key for planned in planner.plan(stack).proxies]


def test_an_unknown_provider_holds_the_proxy_on_the_stack_it_runs_in() -> None:
    planner = Planner()
    planner.set_catalogue(catalogue("local", "gcp-eu"))
    planner.upsert(proxy("a"))
    assert planner.upsert(proxy("a", provider="locl")) == {"local"}
    assert keys(planner, "local") == ["crawl/a"], "held where it runs"
    assert planner.plan("local").proxies[0].proxy.spec.provider == "local"
    assert planner.held_version("crawl/a") is not None
    assert "locl" not in planner.stacks()


def test_a_valid_move_leaves_the_old_stack_and_joins_the_new_one() -> None:
    planner = Planner()
    planner.set_catalogue(catalogue("local", "other"))
    planner.upsert(proxy("a"))
    assert planner.upsert(proxy("a", provider="other")) == {"local", "other"}
    assert keys(planner, "local") == []
    assert keys(planner, "other") == ["crawl/a"]


def test_an_applied_proxy_not_declared_yet_is_held_at_its_applied_version() -> None:
    planner = Planner()
    planner.set_catalogue(catalogue("local"))
    assert planner.remember_applied([proxy("a", port=3001)]) == {"local"}
    assert keys(planner, "local") == ["crawl/a"]
    planner.upsert(proxy("a", port=70000 - 4465))  # a valid new version replaces it
    assert planner.plan("local").proxies[0].proxy.spec.port == 65535
    assert planner.is_applied("crawl/a")


def test_release_drops_a_deleting_proxy_but_not_one_declared_again() -> None:
    planner = Planner()
    planner.set_catalogue(catalogue("local"))
    planner.upsert(proxy("a"))
    leaving = deleting(proxy("a"))
    planner.upsert(leaving)
    assert [p.key for p in planner.plan("local").deleting] == ["crawl/a"]
    planner.upsert(proxy("a"))  # git revert while the removal runs
    assert not planner.release(leaving)
    assert keys(planner, "local") == ["crawl/a"]
    planner.upsert(leaving)
    assert planner.release(leaving)
    assert planner.current("crawl/a") is None


@pytest.mark.parametrize("applied_first", [True, False])
def test_flat_physical_names_never_collide(applied_first: bool) -> None:
    """`a-b/c` and `a/b-c` give the same <namespace>-<name>: the applied one (else the smaller key) keeps
    it, the other is refused with a condition naming both."""
    planner = Planner()
    planner.set_catalogue(catalogue("local"))
    first, second = proxy("b-c", namespace="a"), proxy("c", namespace="a-b")  # a/b-c > a-b/c
    if applied_first:
        planner.remember_applied([first])
    else:
        planner.upsert(first)
    planner.upsert(second)
    winner, loser = ("a/b-c", "a-b/c") if applied_first else ("a-b/c", "a/b-c")
    assert keys(planner, "local") == [winner]
    error = planner.rejected[loser]
    assert isinstance(error, InvalidInputError)
    assert error.reason == "NameCollision"
    assert winner in error.message
    planner.upsert(deleting(planner.current(winner) or proxy("x")))  # the holder leaves: the other may run
    assert loser not in planner.rejected
    assert loser in keys(planner, "local")


def test_an_applied_proxy_that_a_stricter_rule_refuses_blocks_its_stack_and_deletes_nothing(
    tmp_path: Path,
) -> None:
    """An applied entry the current model cannot read (a rule got stricter since) must not be planned away:
    the stack's run stops with a permanent error naming it, and nothing is destroyed."""
    from tests.service.test_declared_deletion import Folder, apply, make_controller

    backend = Backend()
    applied: list[dict[str, Any]] = [
        {"namespace": "crawl", "name": "old", "labels": {}, "spec": {"provider": "local", "port": 99999}},
        {"namespace": "crawl", "name": "ok", "labels": {}, "spec": {"provider": "local", "port": 3001}},
    ]
    backend.stacks["local"] = StackState(
        tags={"proxy-operator:installation": "ours"},
        outputs={"specHash": "x", "appliedProxies": json.loads(json.dumps(applied))},
        proxies={"crawl/old", "crawl/ok"},
    )
    engine = RecordingEngine(backend=backend, installation="ours")
    folder = Folder(tmp_path / "m")
    folder.proxy("ok", port=3001)
    folder.proxy("new", port=3002)

    async def scenario() -> None:
        controller = await apply(make_controller(folder, engine, tmp_path / "s"))
        assert backend.destroyed == []
        assert backend.ups == 0
        state = controller.queue.status("local")
        assert state.last_error is not None
        assert "crawl/old" in state.last_error.message
        await controller.close(grace=1)

    asyncio.run(scenario())


def test_the_same_refusal_is_one_error_for_every_proxy_refused_so() -> None:
    """10,000 Proxies on an unknown provider hold one error between them; a different refusal (another
    provider, a name collision) is its own, with its own reason."""
    planner = Planner()
    planner.set_catalogue(catalogue("local"))
    for name in ("a", "b", "c"):
        planner.upsert(proxy(name, provider="elsewhere"))
    planner.upsert(proxy("d", provider="nowhere"))
    planner.upsert(proxy("b-c", namespace="a"))
    planner.upsert(proxy("c", namespace="a-b"))
    a, b, c, d = (planner.rejected[f"crawl/{n}"] for n in "abcd")
    assert a is b is c
    assert (a.reason, d.reason) == ("UnknownProvider", "UnknownProvider")
    assert d is not a
    assert "nowhere" in d.message
    assert "elsewhere" in a.message
    assert planner.rejected["a/b-c"].reason == "NameCollision"
    planner.upsert(proxy("a", provider="local"))  # fixed: the others stay refused as they were
    assert "crawl/a" not in planner.rejected
    assert planner.rejected["crawl/b"] is b
    assert b.reason == "UnknownProvider"
