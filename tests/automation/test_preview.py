"""GitOps preview with the real Pulumi engine and the `local` provider (no mocks): what applying would do."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from automation.engine import Engine, PreviewStep
from automation.preview import DesiredState, preview
from automation.preview_model import PreviewReport, ProxyChanges, StackPreview, StepModel, proxy_changes
from automation.preview_render import render_markdown, render_text
from service.config import OperatorSettings
from service.runner import apply_once
from service.sources.directory import DirectorySource
from tests.automation.local_example import LocalExample
from tests.conftest import PulumiEnv
from tests.ports import free_port

COMPONENT = "proxy-operator:index:Proxy"
CHILD = "pulumi-python:dynamic/proxy-operator:LocalProxy"


@pytest.fixture
def example(tmp_path: Path) -> Iterator[LocalExample]:
    example = LocalExample(tmp_path / "example")
    yield example
    example.kill_processes()


@pytest.fixture
def settings(pulumi_env: PulumiEnv, tmp_path: Path) -> OperatorSettings:
    return OperatorSettings(state_dir=tmp_path / "state", backend_url=pulumi_env.backend_url)


def desired(manifests: Path) -> DesiredState:
    source = DirectorySource(manifests)
    source.poll()
    assert source.catalogue is not None
    assert not source.problems
    return DesiredState(catalogue=source.catalogue, proxies=source.proxies(), credentials=source)


def backend_files(backend: Path) -> dict[str, tuple[int, int]]:
    """Every file of a file backend: path -> (size, mtime in ns)."""
    return {
        str(path.relative_to(backend)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in backend.rglob("*")
        if path.is_file()
    }


def only(report: PreviewReport) -> StackPreview:
    assert [stack.name for stack in report.stacks] == ["local"]
    return report.stacks[0]


@pytest.mark.engine
def test_preview_through_create_apply_change_and_emptying(
    example: LocalExample, settings: OperatorSettings, pulumi_env: PulumiEnv
) -> None:
    engine = Engine(settings.engine_config())
    try:
        # A fresh backend: every proxy would be created, and the preview writes nothing to the backend:
        # the stack that does not exist yet is previewed elsewhere (not created here and removed again).
        engine.list_stack_names()  # the first use of a file backend writes its .pulumi/meta.yaml
        before = backend_files(pulumi_env.backend_dir)
        fresh = only(preview(engine, desired(example.manifests)))
        assert (fresh.operation, fresh.previewed, fresh.applied_hash) == ("up", True, None)
        assert fresh.proxies == ProxyChanges(create=example.keys)
        assert backend_files(pulumi_env.backend_dir) == before
        assert engine.list_stack_names() == []

        applied = asyncio.run(apply_once(settings, example.manifests))
        assert applied.ok, applied.errors

        # Nothing changed: not previewed by default; previewed with --all, and the engine agrees.
        unchanged = only(preview(engine, desired(example.manifests)))
        assert (unchanged.operation, unchanged.previewed, unchanged.changed) == ("none", False, False)
        assert unchanged.applied_hash == unchanged.desired_hash is not None
        forced = only(preview(engine, desired(example.manifests), all_stacks=True))
        assert (forced.previewed, forced.changed, forced.proxies.any) == (True, False, False)

        # One port changed and one file removed: a replace for that proxy only, and a delete.
        example.set_port("local-2", free_port())
        example.remove("local-3")
        changed = only(preview(engine, desired(example.manifests)))
        assert changed.operation == "up"
        assert changed.proxies == ProxyChanges(replace=["default/local-2"], delete=["default/local-3"])
        replaced = [s for s in changed.steps if s.op == "replace"]
        assert [(s.proxy, s.diffs) for s in replaced] == [("default/local-2", ["port"])]
        assert "+- replace default/local-2 (port)" in render_text(PreviewReport(stacks=[changed]))

        # No proxy left: the stack would be destroyed, deleting every proxy in it.
        for name in list(example.ports):
            example.remove(name)
        emptied = only(preview(engine, desired(example.manifests)))
        assert emptied.operation == "destroy"
        assert emptied.proxies == ProxyChanges(
            delete=["default/local-1", "default/local-2", "default/local-3"]
        )
    finally:
        engine.destroy("local")
    assert example.kill_processes() == []  # destroy stopped them all


def step(op: str, proxy: str | None, *, type_: str = CHILD, diffs: tuple[str, ...] = ()) -> PreviewStep:
    urn = f"urn:pulumi:s::p::{type_}::{proxy or 'default'}"
    return PreviewStep(op=op, urn=urn, type=type_, name=proxy or "default", proxy=proxy, diffs=diffs)


def test_one_verdict_per_proxy() -> None:
    changes = proxy_changes(
        [
            step("create", "ns/new", type_=COMPONENT),
            step("create", "ns/new"),
            step("replace", "ns/moved", diffs=("port",)),
            step("update", "ns/moved"),
            step("create", "ns/grown"),  # a new child under a kept component: the proxy is updated
            step("delete", "ns/gone"),
            step("delete", "ns/gone", type_=COMPONENT),
            step("update", None, type_="pulumi:providers:pulumi-python"),
            step("same", "ns/kept"),
        ]
    )
    assert changes == ProxyChanges(
        create=["ns/new"], update=["ns/grown"], replace=["ns/moved"], delete=["ns/gone"]
    )


def test_markdown_has_a_summary_table_and_details_per_stack() -> None:
    report = PreviewReport(
        stacks=[
            StackPreview(
                name="local",
                operation="up",
                previewed=True,
                proxies=ProxyChanges(create=["ns/a|b"], replace=["ns/c"]),
                steps=[StepModel.of(step("replace", "ns/c", diffs=("port",)))],
            ),
            StackPreview(name="gone", operation="destroy", previewed=False, error="StackLocked: held"),
        ]
    )
    text = render_markdown(report)
    assert "| Stack | Operation | Create | Update | Replace | Delete | Result |" in text
    assert "| `local` | up | 1 | 0 | 1 | 0 | changes |" in text
    assert "| `gone` | destroy | 0 | 0 | 0 | 0 | failed |" in text
    assert text.count("<details>") == 2
    assert text.count("</details>") == 2
    assert "| `ns/a\\|b` | create |" in text  # a pipe in a key cannot break the row
    assert "| `ns/c` | replace | port |" in text
    assert not report.ok
    assert report.totals.failed_stacks == 1
