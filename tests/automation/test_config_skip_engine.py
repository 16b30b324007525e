"""`up` sets the stack's config only when this term has not already set the same (automation/engine/
config_cache.py): the real engine, its CLI calls recorded by a wrapper that runs the real CLI."""

from __future__ import annotations

import dataclasses
import os
import shlex
import socket
import subprocess
from pathlib import Path

import pytest

from automation.engine import Engine, StackInput, Term
from automation.errors import ProxyOperatorError
from automation.planner import Planner
from automation.stack_input import resolve_stack
from stacks.models import ProviderCatalogue, Proxy
from tests.automation.fleet import Fleet, accepts, proxy_doc
from tests.conftest import TOOLS_BIN
from tests.ports import free_port

pytestmark = pytest.mark.engine

SET_ALL = "config set-all"


class Calls:
    """The `pulumi` command lines the engine ran, one a line, through a wrapper that execs the real CLI."""

    def __init__(self, folder: Path) -> None:
        self.log = folder / "calls"
        self.cli = folder / "bin" / "pulumi"
        self.cli.parent.mkdir(parents=True)
        self.cli.write_text(
            f'#!/bin/sh\nprintf "%s\\n" "$*" >> {shlex.quote(str(self.log))}\n'
            f'exec {shlex.quote(str(TOOLS_BIN / "pulumi"))} "$@"\n'
        )
        self.cli.chmod(0o755)

    def taken(self) -> list[str]:
        """The calls since the last `taken()`."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        self.log.write_text("")
        return lines

    def sets_config(self) -> bool:
        calls = self.taken()
        assert any(" up " in f" {call} " for call in calls), calls  # an `up` did run each time
        return any(SET_ALL in call for call in calls)


@pytest.fixture
def calls(tmp_path: Path) -> Calls:
    return Calls(tmp_path / "recorded")


@pytest.fixture
def engine(fleet: Fleet, calls: Calls) -> Engine:
    return Engine(dataclasses.replace(fleet.settings().engine_config(), pulumi=calls.cli))


def spec(fleet: Fleet, *, port: int) -> StackInput:
    planner = Planner()
    entry = {"name": "local", "type": "local", "stateDir": str(fleet.local_state / "local")}
    planner.set_catalogue(ProviderCatalogue.model_validate({"providers": [entry]}))
    planner.upsert(Proxy.model_validate(proxy_doc("p0", port=port)))
    return resolve_stack(planner.plan("local"), credentials=_NoSecrets()).input


def test_a_second_up_with_the_same_input_sets_no_config_and_a_changed_one_does(
    fleet: Fleet, engine: Engine, calls: Calls
) -> None:
    first = spec(fleet, port=free_port())
    engine.up(first)
    assert calls.sets_config()
    engine.up(first)
    assert not calls.sets_config(), "the same input set the same config again"
    port = free_port()
    moved = spec(fleet, port=port)
    result = engine.up(moved)
    assert calls.sets_config(), "a changed input did not reach the stack's config"
    assert result.outputs["specHash"] == moved.spec_hash
    assert accepts(port)
    engine.up(moved)
    assert not calls.sets_config()
    engine.destroy("local")


def test_a_config_written_by_anyone_else_is_set_again(fleet: Fleet, engine: Engine, calls: Calls) -> None:
    applied = spec(fleet, port=free_port())
    engine.up(applied)
    calls.taken()
    work = engine.config.state_dir / "work" / "local"
    subprocess.run(  # another writer of the same work directory (a person, another process)
        [str(TOOLS_BIN / "pulumi"), "config", "set", "--stack", "local", "proxy-operator:probeUrl", "x"],
        cwd=work,
        env={**os.environ, **engine.config.environment()},
        check=True,
        capture_output=True,
    )
    engine.up(applied)
    assert calls.sets_config(), "the file changed behind the engine and its config was not set again"
    engine.destroy("local")


def test_a_new_term_a_failed_up_a_refresh_and_a_destroy_set_it_again(
    fleet: Fleet, engine: Engine, calls: Calls
) -> None:
    applied = spec(fleet, port=free_port())
    engine.up(applied)
    calls.taken()
    second = engine.in_term(Term("second"))
    second.up(applied)
    assert calls.sets_config(), "a new term trusted what an earlier term wrote"
    second.up(applied)
    assert not calls.sets_config()

    with socket.socket() as holder:  # the next port is taken: the proxy cannot start, the `up` fails
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        blocked = spec(fleet, port=holder.getsockname()[1])
        with pytest.raises(ProxyOperatorError):
            second.up(blocked)
        calls.taken()
        with pytest.raises(ProxyOperatorError):
            second.up(blocked)
        assert calls.sets_config(), "the config of a failed `up` was trusted"

    second.up(applied)
    calls.taken()
    second.up(applied, refresh=True)
    assert calls.sets_config(), "a refresh trusted the config"

    second.destroy("local")
    calls.taken()
    second.up(applied)
    assert calls.sets_config(), "the stack was destroyed and re-created; its config was not set"
    second.destroy("local")


class _NoSecrets:
    def credentials_for(self, proxy: Proxy) -> None:
        return None

    def secret_value(self, name: str, key: str) -> None:
        return None
