"""The project's own Pulumi CLI and Python language host, driven through the Automation API.

Nothing is mocked: `make tools` installed the engine under .tools/bin and these tests run it on a file backend
in a temporary folder (see the `pulumi_env` fixture).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from pulumi import automation as auto

from tests.conftest import PulumiEnv

pytestmark = pytest.mark.engine

PLAIN_PROGRAM = """
import pulumi

class Box(pulumi.ComponentResource):
    def __init__(self, name, size, opts=None):
        super().__init__("test:index:Box", name, None, opts)
        self.size = pulumi.Output.from_input(size)
        self.register_outputs({"size": self.size})

config = pulumi.Config()
box = Box("box", config.require_int("size"))
pulumi.export("size", box.size)
pulumi.export("greeting", "hello " + config.require("name"))
pulumi.export("root", pulumi.get_root_directory())
"""

DYNAMIC_PROGRAM = """
import pulumi
from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider

class CounterProvider(ResourceProvider):
    def create(self, props):
        start = int(props["start"])
        return CreateResult(id_=f"counter-{start}", outs={"start": start, "value": start * 2})

    def diff(self, id, olds, news):  # olds are the outputs of create
        changed = olds["start"] != news["start"]
        return DiffResult(changes=changed, replaces=["start"] if changed else [])

class Counter(Resource):
    value: pulumi.Output[int]

    def __init__(self, name, start, opts=None):
        super().__init__(CounterProvider(), name, {"start": start, "value": None}, opts)

counter = Counter("counter", pulumi.Config().require_int("start"))
pulumi.export("value", counter.value)
"""


def _project(tmp_path: Path, name: str, program: str) -> Path:
    work = tmp_path / name
    work.mkdir()
    (work / "Pulumi.yaml").write_text(f"name: {name}\nruntime: python\n")
    (work / "__main__.py").write_text(textwrap.dedent(program))
    return work


def _stack(work: Path, name: str) -> auto.Stack:
    return auto.create_stack(name, work_dir=str(work))


def test_preview_up_noop_destroy_remove(pulumi_env: PulumiEnv, tmp_path: Path) -> None:
    work = _project(tmp_path, "smoke", PLAIN_PROGRAM)
    stack = _stack(work, "dev")
    stack.set_config("size", auto.ConfigValue("3"))
    stack.set_config("name", auto.ConfigValue("crawler"))

    preview = stack.preview()
    assert preview.change_summary.get("create", 0) == 2  # the stack and the component

    up = stack.up()
    assert up.summary.result == "succeeded"
    assert up.outputs["size"].value == 3
    assert up.outputs["greeting"].value == "hello crawler"
    assert up.outputs["root"].value == str(work)  # the language host passes the project root on
    assert stack.outputs()["greeting"].value == "hello crawler"

    again = stack.up()
    assert again.summary.resource_changes == {"same": 2}

    destroyed = stack.destroy()
    assert destroyed.summary.result == "succeeded"
    assert destroyed.summary.resource_changes.get("delete") == 2
    stack.workspace.remove_stack("dev")
    assert [s.name for s in stack.workspace.list_stacks()] == []
    assert not list((pulumi_env.backend_dir / ".pulumi" / "stacks").rglob("dev.json"))


def test_dynamic_provider_resource(pulumi_env: PulumiEnv, tmp_path: Path) -> None:
    work = _project(tmp_path, "dynamic", DYNAMIC_PROGRAM)
    stack = _stack(work, "dev")
    stack.set_config("start", auto.ConfigValue("21"))

    up = stack.up()
    assert up.outputs["value"].value == 42
    state = stack.export_stack().deployment
    dynamic = [r for r in state["resources"] if r["type"] == "pulumi-python:dynamic:Resource"]
    assert [r["id"] for r in dynamic] == ["counter-21"]

    stack.set_config("start", auto.ConfigValue("5"))
    replaced = stack.up()
    assert replaced.outputs["value"].value == 10
    assert replaced.summary.resource_changes.get("replace") == 1

    assert stack.destroy().summary.result == "succeeded"
    stack.workspace.remove_stack("dev")
