"""Deletion is declared, never inferred: the directory source, the control loop and the reconciler together.

The engine is `RecordingEngine` (tests/automation/standin_engine.py), a stand-in that keeps stacks in memory:
the real engine takes seconds per run, too slow for a property test of hundreds of examples. The same faults
run against the real engine and real proxies in tests/automation/test_faults_engine.py.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.config import OperatorSettings
from service.controller import Controller
from service.inventory import Inventory
from service.runner import _report, _settle
from service.sources.directory import DirectorySource
from tests.automation.standin_engine import Backend, RecordingEngine

NAMES = ["a", "b", "c", "d", "e", "f", "g", "h"]


@dataclass
class Folder:
    """A manifests folder: one file per Proxy, a catalogue, a Secret; every write bumps the mtime."""

    root: Path
    tick: int = field(default_factory=time.time_ns)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.catalogue()

    def _write(self, name: str, text: str) -> None:
        path = self.root / name
        path.write_text(text)
        self.tick += 1_000_000
        os.utime(path, ns=(self.tick, self.tick))

    def catalogue(self, *providers: str) -> None:
        entries = [{"name": p, "type": "local"} for p in (providers or ("local",))]
        self._write("catalogue.yaml", yaml.safe_dump({"providers": entries}))

    def proxy(self, name: str, *, port: Any = 3128, provider: str = "local", **spec: Any) -> None:
        self._write(
            f"proxy-{name}.yaml", yaml.safe_dump(proxy_doc(name, port=port, provider=provider, **spec))
        )

    def secret(self, **data: Any) -> None:
        doc = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "auth", "namespace": "crawl"},
            **data,
        }
        self._write("secret.yaml", yaml.safe_dump(doc))

    def remove(self, file: str) -> None:
        (self.root / file).unlink(missing_ok=True)
        self.tick += 1_000_000
        os.utime(self.root, ns=(self.tick, self.tick))

    def miskind(self, name: str, *, kind: str) -> None:
        self._write(f"proxy-{name}.yaml", yaml.safe_dump(proxy_doc(name, port=3000) | {"kind": kind}))

    def corrupt(self, file: str) -> None:
        self._write(file, "kind: Proxy\nmetadata: {name: x\n")


def proxy_doc(name: str, *, port: Any, provider: str = "local", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": "crawl", "annotations": spec.pop("annotations", {})},
        "spec": {"provider": provider, "port": port, "allowedSourceRanges": ["127.0.0.0/8"], **spec},
    }


def make_controller(folder: Folder, engine: RecordingEngine, state: Path, **overrides: Any) -> Controller:
    settings = OperatorSettings(
        state_dir=state,
        backend_url="file:///unused-by-the-stand-in",
        installation=engine.installation,
        backoff_base_seconds=0.01,
        backoff_cap_seconds=0.02,
        resync_seconds=0,
        # sync() is called by hand here: deletions are judged at once (the window's quiet point is tested
        # in tests/service/test_deletion_window.py); removals still add up over the window's horizon
        **{"deletion_window_quiet_seconds": 0.0, **overrides},
    )
    return Controller(
        settings=settings,
        engine=engine,  # type: ignore[arg-type]
        source=DirectorySource(folder.root),
        inventory=Inventory(),
    )


async def apply(controller: Controller) -> Controller:
    """What `up` and each poll of `serve` do: read the folder (it holds still), reconcile, settle."""
    if not controller.started:
        await controller.start()
    controller.sync()  # a change is acted on once the folder held still for one poll
    await _settle(controller)
    return controller


async def running_fleet(folder: Folder, engine: RecordingEngine, state: Path) -> Controller:
    """Eight proxies (`NAMES`) declared and applied: a fleet a deletion can be measured against."""
    for i, name in enumerate(NAMES):
        folder.proxy(name, port=3000 + i)
    return await apply(make_controller(folder, engine, state))


def held_reason(controller: Controller, key: str) -> str | None:
    condition = controller.status.held().get(key)
    return condition.reason if condition else None


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- examples ----------------------------------------------------------------------------------------------


def test_a_restart_then_an_invalid_edit_keeps_the_applied_version(tmp_path: Path) -> None:
    folder = Folder(tmp_path / "m")
    engine = RecordingEngine(installation="ours")

    async def scenario() -> None:
        folder.proxy("a", port=3001)
        folder.proxy("b", port=3002)
        first = await apply(make_controller(folder, engine, tmp_path / "s"))
        await first.close(grace=1)
        folder.proxy("a", port=70000)  # invalid, and the next process never saw a valid version of it
        folder.proxy("b", port=3002, provider="locl")  # a typo: held on the stack it runs in
        second = await apply(make_controller(folder, engine, tmp_path / "s"))
        assert engine.backend.destroyed == []
        assert held_reason(second, "crawl/a") == "InvalidSpec"
        assert held_reason(second, "crawl/b") == "UnknownProvider"
        assert engine.backend.ups == 1, "holding is a no-change for the stack"
        assert second.inventory.get("crawl/a") is not None
        await second.close(grace=1)

    run(scenario())


def test_a_renamed_catalogue_entry_holds_its_proxies_on_the_old_stack(tmp_path: Path) -> None:
    folder = Folder(tmp_path / "m")
    engine = RecordingEngine(installation="ours")

    async def scenario() -> None:
        folder.proxy("a", port=3001)
        await (await apply(make_controller(folder, engine, tmp_path / "s"))).close(grace=1)
        folder.catalogue("local-renamed")  # the proxies still name `local`
        second = await apply(make_controller(folder, engine, tmp_path / "s"))
        assert engine.backend.destroyed == []
        assert "local" in engine.stacks
        assert held_reason(second, "crawl/a") in ("UnknownProvider", "ProviderMissing")
        await second.close(grace=1)

    run(scenario())


def test_a_misspelt_kind_holds_the_running_proxy_and_says_why(tmp_path: Path) -> None:
    """`kind: proxy` used to read as "no Proxy a here": a clean read, so `a` was declared deleted."""
    folder = Folder(tmp_path / "m")
    engine = RecordingEngine(installation="ours")

    async def scenario() -> None:
        folder.proxy("a", port=3001)
        folder.proxy("b", port=3002)
        controller = await apply(make_controller(folder, engine, tmp_path / "s"))
        folder.miskind("a", kind="proxy")
        folder.remove("proxy-b.yaml")  # ...and a real removal beside it: not declared until the typo goes
        await apply(controller)
        assert engine.backend.destroyed == []
        assert held_reason(controller, "crawl/a") == "NotDeclared"
        assert held_reason(controller, "crawl/b") == "NotDeclared"
        message = controller.status.held()["crawl/a"].message
        assert 'kind "proxy"' in message
        assert 'did you mean "Proxy"?' in message
        assert any("did you mean" in str(p) for p in controller.source.problems)
        folder.proxy("a", port=3001)  # fixed: now b's removal is declared, a stays
        await apply(controller)
        assert engine.backend.destroyed == ["crawl/b"]
        await controller.close(grace=1)

    run(scenario())


def test_a_restored_proxy_survives_its_finishing_deletion(tmp_path: Path) -> None:
    """git revert while the removal's `up` runs: releasing must not drop the proxy declared again."""
    folder = Folder(tmp_path / "m")
    engine = RecordingEngine(installation="ours")

    async def scenario() -> None:
        folder.proxy("a", port=3001)
        folder.proxy("b", port=3002)
        controller = await apply(make_controller(folder, engine, tmp_path / "s"))
        engine.gate, engine.started = threading.Event(), threading.Event()
        folder.remove("proxy-a.yaml")
        controller.sync()
        controller.sync()  # held still: a's deletion is declared and its stack submitted
        assert await asyncio.to_thread(engine.started.wait, 10), "the removing up never started"
        folder.proxy("a", port=3001)  # restored while that up runs
        controller.sync()
        controller.sync()
        engine.gate.set()
        await _settle(controller)
        assert controller.planner.current("crawl/a") is not None, "dropped from the planner"
        assert "crawl/a" in engine.stacks["local"].proxies, "recreated by the follow-up run"
        assert controller.status.get("crawl/a").phase == "Ready"
        await controller.close(grace=1)

    run(scenario())


def test_the_deletion_budget_stops_a_large_removal_until_allowed_once(tmp_path: Path) -> None:
    folder = Folder(tmp_path / "m")
    engine = RecordingEngine(installation="ours")

    async def scenario() -> None:
        controller = await running_fleet(folder, engine, tmp_path / "s")
        for name in NAMES[:6]:  # 6 of 8: more than half and more than 5
            folder.remove(f"proxy-{name}.yaml")
        await apply(controller)
        assert engine.backend.destroyed == []
        held = controller.held_deletion
        assert held is not None
        assert held.keys == tuple(f"crawl/{n}" for n in NAMES[:6])
        report = _report(controller)
        assert not report.ok
        assert held.change_id in (report.held_deletion or "")
        assert held_reason(controller, "crawl/a") == "DeletionHeld"

        assert not controller.allow_deletions("000000000000"), "an id of no waiting change allows nothing"
        await _settle(controller)
        assert engine.backend.destroyed == []
        assert controller.allow_deletions(held.change_id)
        await _settle(controller)
        assert sorted(engine.backend.destroyed) == list(held.keys)
        assert controller.held_deletion is None

        # The allowance was used up: the next large removal stops again.
        for i, name in enumerate(["p", "q", "r", "s", "t", "u", "v"]):
            folder.proxy(name, port=4000 + i)
        await apply(controller)
        for name in ["p", "q", "r", "s", "t", "u"]:
            folder.remove(f"proxy-{name}.yaml")
        await apply(controller)
        assert controller.held_deletion is not None
        assert len(engine.backend.destroyed) == 6
        await controller.close(grace=1)

    run(scenario())


def test_a_small_removal_needs_no_allowance_and_an_emptied_fleet_is_one_step(tmp_path: Path) -> None:
    folder = Folder(tmp_path / "m")
    engine = RecordingEngine(installation="ours")

    async def scenario() -> None:
        controller = await running_fleet(folder, engine, tmp_path / "s")
        folder.remove("proxy-a.yaml")
        await apply(controller)
        assert engine.backend.destroyed == ["crawl/a"]
        for name in NAMES[1:]:
            folder.remove(f"proxy-{name}.yaml")
        await apply(controller)
        held = controller.held_deletion
        assert held is not None
        controller.allow_deletions(held.change_id)  # one explicit step empties the fleet
        await _settle(controller)
        assert sorted(engine.backend.destroyed) == [f"crawl/{n}" for n in NAMES]
        assert "local" not in engine.stacks, "an emptied provider's stack is destroyed and removed"
        await controller.close(grace=1)

    run(scenario())


def test_a_missing_secret_keeps_the_applied_credentials(tmp_path: Path) -> None:
    folder = Folder(tmp_path / "m")
    engine = RecordingEngine(installation="ours")

    async def scenario() -> None:
        folder.secret(stringData={"username": "crawler", "password": "pw"})
        folder.proxy("s", port=3001, auth={"mode": "secret", "secretRef": {"name": "auth"}})
        await (await apply(make_controller(folder, engine, tmp_path / "s"))).close(grace=1)
        folder.remove("secret.yaml")
        second = await apply(make_controller(folder, engine, tmp_path / "s"))
        assert engine.backend.destroyed == []
        assert engine.backend.ups == 1
        assert held_reason(second, "crawl/s") == "CredentialsMissing"
        assert engine.stacks["local"].outputs["credentials"]["crawl/s"]["password"] == "pw"
        await second.close(grace=1)

    run(scenario())


def test_foreign_and_unclaimed_stacks_are_left_alone_untagged_ones_of_ours_adopted(tmp_path: Path) -> None:
    backend = Backend()
    theirs = RecordingEngine(backend=backend, installation="theirs")
    ours = RecordingEngine(backend=backend, installation="ours")
    folder = Folder(tmp_path / "m")
    other = Folder(tmp_path / "other")

    async def scenario() -> None:
        other.catalogue("local", "legacy")
        other.proxy("z", port=3009)
        other.proxy("y", port=3008, provider="legacy")
        await (await apply(make_controller(other, theirs, tmp_path / "t"))).close(grace=1)
        del backend.stacks["legacy"].tags["proxy-operator:installation"]  # made before owner tags

        folder.catalogue("local", "legacy")
        folder.proxy("a", port=3001)
        controller = await apply(make_controller(folder, ours, tmp_path / "s"))
        assert backend.stacks["local"].proxies == {"crawl/z"}, "the foreign stack was not touched"
        assert "StackNotOwned" in _report(controller).errors["local"]
        # `legacy` was untagged and our catalogue names it: adopted, then emptied by a clean read (our
        # manifests do not declare y: a declared deletion, under the budget).
        assert "legacy" not in backend.stacks, "adopted, and its undeclared proxy removed by a clean read"
        assert backend.destroyed == ["crawl/y"]
        await controller.close(grace=1)

    run(scenario())


def test_a_failing_pass_never_kills_the_loop(tmp_path: Path) -> None:
    folder = Folder(tmp_path / "m")
    engine = RecordingEngine(installation="ours")

    async def scenario() -> None:
        folder.proxy("a", port=3001)
        controller = make_controller(folder, engine, tmp_path / "s", poll_seconds=0.05)
        calls = {"n": 0}
        failed, later = asyncio.Event(), asyncio.Event()
        real_sync = controller.sync

        def flaky_sync() -> set[str]:
            calls["n"] += 1
            if calls["n"] == 6:
                later.set()
            if calls["n"] == 3:
                failed.set()
                raise RuntimeError("boom")
            return real_sync()

        controller.sync = flaky_sync  # type: ignore[method-assign]
        stop = asyncio.Event()
        loop = asyncio.create_task(controller.run(stop))
        await asyncio.wait_for(failed.wait(), 10)
        await asyncio.sleep(0)  # let the pass that raised finish
        assert controller.loop_error is not None
        assert "boom" in controller.loop_error
        await asyncio.wait_for(later.wait(), 10)
        assert controller.loop_error is None, "the loop recovered at the next pass"
        stop.set()
        await loop
        await controller.close(grace=1)

    run(scenario())


# --- the property --------------------------------------------------------------------------------------

OPS = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(NAMES[:5]), st.integers(3000, 3004)),
    st.tuples(st.just("remove"), st.sampled_from(NAMES[:5]), st.none()),
    st.tuples(st.just("corrupt"), st.sampled_from(NAMES[:5]), st.none()),
    st.tuples(st.just("invalid"), st.sampled_from(NAMES[:5]), st.none()),
    st.tuples(st.just("typo"), st.sampled_from(NAMES[:5]), st.none()),
    st.tuples(st.just("nameless"), st.sampled_from(NAMES[:5]), st.none()),
    st.tuples(
        st.just("miskind"), st.sampled_from(NAMES[:5]), st.sampled_from(["proxy", "Proxies", "ProxyPol"])
    ),
    st.tuples(st.just("drop-catalogue"), st.none(), st.none()),
    st.tuples(st.just("restore-catalogue"), st.none(), st.none()),
    st.tuples(st.just("restart"), st.none(), st.none()),
)


@dataclass
class Oracle:
    """What the test knows about the folder: which proxies each file declares and whether it reads clean."""

    files: dict[str, str] = field(
        default_factory=dict
    )  # name -> "valid" | "invalid" | "corrupt" | "nameless" | "miskind"
    catalogue: bool = True

    def clean(self) -> bool:
        return self.catalogue and not any(
            state in ("corrupt", "nameless", "miskind") for state in self.files.values()
        )

    def declared(self) -> set[str]:
        return {f"crawl/{name}" for name in self.files}


@settings(
    max_examples=int(os.environ.get("DECLARED_DELETION_EXAMPLES", "400")),
    deadline=None,
    derandomize=True,  # the seed is fixed: CI and a developer see the same examples
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(OPS, min_size=1, max_size=14))
def test_no_proxy_is_destroyed_unless_removed_from_a_clean_read(tmp_path_factory: Any, ops: list) -> None:
    root = tmp_path_factory.mktemp("prop")
    folder = Folder(root / "m")
    engine = RecordingEngine(installation="ours")
    oracle = Oracle()

    async def scenario() -> None:
        controller = make_controller(folder, engine, root / "s", deletion_budget_count=100)
        await apply(controller)
        deletable: set[str] = set()
        for op, name, port in ops:
            if op == "restart":
                await controller.close(grace=1)
                controller = make_controller(folder, engine, root / "s", deletion_budget_count=100)
            else:
                _perform(folder, oracle, op, name, port)
            if oracle.clean():
                # a clean read declares the removal of whatever ever ran and is not declared now
                deletable |= {k for k in engine.backend.created if k not in oracle.declared()}
            deletable -= oracle.declared()
            before = len(engine.backend.destroyed)
            await apply(controller)
            destroyed = set(engine.backend.destroyed[before:])
            assert destroyed <= deletable, (
                f"destroyed {sorted(destroyed - deletable)} after {op} {name}, never removed from a clean "
                f"read; files={oracle.files} catalogue={oracle.catalogue}"
            )
        await controller.close(grace=1)

    run(scenario())


def _perform(folder: Folder, oracle: Oracle, op: str, name: str | None, port: int | str | None) -> None:
    file = f"proxy-{name}.yaml"
    if op == "write" and name is not None:
        folder.proxy(name, port=port)
        oracle.files[name] = "valid"
    elif op == "remove" and name is not None:
        folder.remove(file)
        oracle.files.pop(name, None)
    elif op == "corrupt" and name is not None and name in oracle.files:
        folder.corrupt(file)
        oracle.files[name] = "corrupt"
    elif op == "invalid" and name is not None and name in oracle.files:
        folder.proxy(name, port=70000)
        oracle.files[name] = "invalid"
    elif op == "typo" and name is not None and name in oracle.files:
        folder.proxy(name, port=3000, provider="locl")
        oracle.files[name] = "invalid"
    elif op == "nameless" and name is not None and name in oracle.files:
        doc = proxy_doc(name, port=3000)
        del doc["metadata"]["name"]
        folder._write(file, yaml.safe_dump(doc))
        oracle.files[name] = "nameless"
    elif op == "miskind" and name is not None and name in oracle.files:
        folder.miskind(name, kind=str(port))
        oracle.files[name] = "miskind"
    elif op == "drop-catalogue":
        folder.remove("catalogue.yaml")
        oracle.catalogue = False
    elif op == "restore-catalogue":
        folder.catalogue()
        oracle.catalogue = True


@dataclass
class OverlapEngine(RecordingEngine):
    """The tag read waits (up to 10 s) for the outputs read of the same stack to have begun."""

    outputs_begun: dict[str, threading.Event] = field(default_factory=dict)
    waited: list[tuple[str, bool]] = field(default_factory=list)

    def _begun(self, name: str) -> threading.Event:
        return self.outputs_begun.setdefault(name, threading.Event())

    def stack_tags(self, name: str) -> dict[str, str] | None:
        self.waited.append((name, self._begun(name).wait(10)))
        return super().stack_tags(name)

    def plain_outputs(self, name: str) -> dict[str, Any]:
        self._begun(name).set()
        return super().plain_outputs(name)


def test_a_stack_read_runs_its_ownership_check_and_its_outputs_read_at_once(tmp_path: Path) -> None:
    """A new term reads every stack before it acts: the tag read and the outputs read of a stack run at
    once, not one after the other (issue 20). A foreign stack's early outputs are never used."""
    backend = Backend()
    theirs = RecordingEngine(backend=backend, installation="theirs")
    ours = OverlapEngine(backend=backend, installation="ours")
    folder, other = Folder(tmp_path / "m"), Folder(tmp_path / "other")

    async def scenario() -> None:
        other.catalogue("legacy")
        other.proxy("z", port=3009, provider="legacy")
        await (await apply(make_controller(other, theirs, tmp_path / "t"))).close(grace=1)
        folder.catalogue("local", "legacy")
        folder.proxy("a", port=3001)
        first = await apply(
            make_controller(folder, RecordingEngine(backend=backend, installation="ours"), tmp_path / "s")
        )
        await first.close(grace=1)

        controller = await apply(make_controller(folder, ours, tmp_path / "s2"))
        assert sorted(ours.waited) == [("legacy", True), ("local", True)], "a tag read waited alone"
        assert "StackNotOwned" in _report(controller).errors["legacy"]
        assert backend.stacks["legacy"].proxies == {"crawl/z"}, "the foreign stack was not touched"
        assert controller.planner.current("crawl/z") is None, "nothing was learned from a foreign stack"
        await controller.close(grace=1)

    run(scenario())
