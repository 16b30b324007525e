"""Run a provider-type program under `pulumi.runtime.set_mocks` and record what it registers.

The kubernetes, gcp and libvirt provider plugins cannot be downloaded here, so those programs are tested
with mocks: every registration is recorded, and the test asserts on the inputs the program sent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pulumi

from stacks.models import ProxySpec
from stacks.programs import StackOutputs, build_stack
from stacks.programs.component import ProgramProxy
from stacks.programs.context import ProgramSettings

GENERATED = {"username": "ugenerated01", "password": "GeneratedPassword123"}


@dataclass
class Registered:
    typ: str
    name: str
    inputs: dict[str, Any]
    provider: str | None


@dataclass
class RecordingMocks(pulumi.runtime.Mocks):
    """Echoes inputs as outputs, plus the computed outputs a test names per resource type."""

    computed: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = field(default_factory=dict)
    resources: list[Registered] = field(default_factory=list)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources.append(Registered(args.typ, args.name, dict(args.inputs), args.provider))
        outputs = dict(args.inputs)
        if args.typ.endswith(":GeneratedCredentials"):
            outputs.update(GENERATED)
        if args.typ in self.computed:
            outputs.update(self.computed[args.typ](outputs))
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        return {}

    def of_type(self, typ: str) -> list[Registered]:
        return [r for r in self.resources if r.typ == typ]

    def one(self, typ: str) -> Registered:
        [found] = self.of_type(typ)
        return found


def install(mocks: RecordingMocks, *, stack: str) -> None:
    pulumi.runtime.set_mocks(mocks, project="proxy-operator", stack=stack, preview=False)


def proxy(name: str, *, namespace: str = "crawl", **spec: Any) -> ProgramProxy:
    return ProgramProxy(namespace=namespace, name=name, spec=ProxySpec.model_validate(spec))


def run(
    *,
    entry: Any,
    proxies: list[ProgramProxy],
    settings: ProgramSettings,
    credentials: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build the stack under `pulumi.runtime.test`; return its resolved outputs once every RPC is done."""
    resolved: dict[str, Any] = {}

    @pulumi.runtime.test
    def program() -> pulumi.Output[Any]:
        outputs: StackOutputs = build_stack(
            entry=entry, proxies=proxies, given_credentials=credentials or {}, settings=settings
        )
        return pulumi.Output.all(outputs.proxies, outputs.credentials).apply(
            lambda values: resolved.update(proxies=values[0], credentials=values[1])
        )

    program()
    assert resolved, "the program's outputs never resolved"
    return resolved
