"""A recording stand-in for the Pulumi engine: stacks in memory, every created and destroyed proxy recorded.

The real engine takes seconds per operation, too slow for the hundreds of examples a property test runs;
`test_faults_engine.py` covers the same faults with the real one. This stand-in keeps the contract the
reconciler relies on: outputs echo `specHash`, `appliedProxies`, `proxies` and `credentials` as the program
does; stacks carry tags; `up` replaces a stack's proxy set with the one it is given; `destroy` removes the
stack; `forget` drops proxies from state without destroying them.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from automation.engine import OWNER_TAG, OperationResult, PreviewStep, StackInput


@dataclass
class StackState:
    tags: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    proxies: set[str] = field(default_factory=set)


@dataclass
class Backend:
    """The 'state backend': shared by every engine of a test, so restarts and installations see it."""

    stacks: dict[str, StackState] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    destroyed: list[str] = field(default_factory=list)  # proxies whose resources were removed
    forgotten: list[str] = field(default_factory=list)
    ups: int = 0


@dataclass
class RecordingEngine:
    """One installation's engine over a `Backend`; new stacks are tagged with its installation."""

    backend: Backend = field(default_factory=Backend)
    installation: str | None = None
    gate: threading.Event | None = None  # when a test sets one, `up` waits for it (a run in progress)
    started: threading.Event = field(default_factory=threading.Event)  # set when an `up` begins

    @property
    def stacks(self) -> dict[str, StackState]:
        return self.backend.stacks

    def in_term(self, term: object) -> RecordingEngine:
        """The real engine's term view (its fence is tested with the real engine): the same object."""
        return self

    def list_stack_names(self) -> list[str]:
        return sorted(self.stacks)

    def exists(self, name: str) -> bool:
        return name in self.stacks

    def stack_tags(self, name: str) -> dict[str, str] | None:
        stack = self.stacks.get(name)
        return None if stack is None else dict(stack.tags)

    def set_owner(self, name: str, installation: str) -> None:
        self.stacks[name].tags[OWNER_TAG] = installation

    def plain_outputs(self, name: str) -> dict[str, Any]:
        stack = self.stacks.get(name)
        return {} if stack is None else json.loads(json.dumps(stack.outputs))

    def up(self, spec: StackInput, *, refresh: bool = False) -> OperationResult:
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(timeout=10), "the test never opened the gate"
        self.backend.ups += 1
        stack = self.stacks.get(spec.name)
        if stack is None:
            stack = self.stacks[spec.name] = StackState()
            if self.installation:
                stack.tags[OWNER_TAG] = self.installation
        assert stack.tags.get(OWNER_TAG) in (None, self.installation), "an up on a foreign stack"
        applied = json.loads(spec.proxies_json)
        keys = {f"{p['namespace']}/{p['name']}" for p in applied}
        self.backend.created += sorted(keys - stack.proxies)
        self.backend.destroyed += sorted(stack.proxies - keys)
        stack.proxies = keys
        given = json.loads(spec.credentials_json)
        stack.outputs = {
            "specHash": spec.spec_hash,
            "appliedProxies": applied,
            "proxies": {
                f"{p['namespace']}/{p['name']}": {
                    "host": "127.0.0.1",
                    "port": p["spec"]["port"],
                    "protocol": "http",
                }
                for p in applied
            },
            "credentials": {key: given.get(key) or {"username": "u", "password": "p"} for key in keys},
        }
        return OperationResult(
            stack=spec.name, kind="up", result="succeeded", changes={"create": 1}, outputs=stack.outputs
        )

    def destroy(self, name: str) -> OperationResult | None:
        stack = self.stacks.get(name)
        if stack is None:
            return None
        assert stack.tags.get(OWNER_TAG) in (None, self.installation), "a destroy of a foreign stack"
        del self.stacks[name]
        self.backend.destroyed += sorted(stack.proxies)
        return OperationResult(stack=name, kind="destroy", result="succeeded", changes={"delete": 1})

    def forget(self, name: str, components: list[str]) -> dict[str, list[str]]:
        stack = self.stacks.get(name)
        forgotten: dict[str, list[str]] = {}
        for key in components:
            present = stack is not None and key in stack.proxies
            if stack is not None and present:
                stack.proxies.discard(key)
                self.backend.forgotten.append(key)
            forgotten[key] = [f"urn:{key}"] if present else []
        return forgotten

    def detect_drift(self, name: str) -> list[PreviewStep]:
        return []
