"""Stack lock recovery: a dead pid on this host, or another host that the injected check says is gone."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pulumi import automation as auto
from pulumi.automation._cmd import CommandResult

from automation.engine import Engine, EngineConfig
from automation.engine.locks import LockRecovery

HERE = "replica-a"
GONE_PID = 2**22 + 1  # above pid_max's default ceiling: never a live process


def locked(*holders: tuple[str, int]) -> str:
    """The CLI's message for a locked stack, one line per lock, as `pulumi up` prints it."""
    lines = [
        f"  file:///state/.pulumi/locks/organization/proxy-operator/local/{i}.json: created by "
        f"root@{host} (pid {pid}) at 2026-11-30T10:00:00Z"
        for i, (host, pid) in enumerate(holders)
    ]
    return "error: the stack is currently locked by 1 lock(s).\n" + "\n".join(lines)


@dataclass
class FakeStack:
    name: str = "local"
    cancels: int = 0

    def cancel(self) -> None:
        self.cancels += 1


@dataclass
class Check:
    """A `foreign_gone` predicate that answers from `gone` and records what it was asked."""

    gone: set[str] = field(default_factory=set)
    asked: list[str] = field(default_factory=list)

    def __call__(self, host: str) -> bool:
        self.asked.append(host)
        return host in self.gone


def test_a_lock_of_another_host_is_recovered_when_the_check_says_its_holder_is_gone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    check, stack = Check(gone={"replica-old"}), FakeStack()
    recovery = LockRecovery(hostname=HERE, foreign_gone=check)
    with caplog.at_level(logging.WARNING, logger="automation.engine.locks"):
        assert recovery.recover_if_stale(stack=stack, message=locked(("replica-old", 7)))
    assert (stack.cancels, check.asked) == (1, ["replica-old"])
    assert "root@replica-old (pid 7)" in caplog.text
    assert "replica-old is gone" in caplog.text


@pytest.mark.parametrize(
    "check",
    [None, Check(gone=set())],
    ids=["no check", "check says alive"],
)
def test_a_lock_of_another_host_stays_when_nobody_says_its_holder_is_gone(check: Check | None) -> None:
    stack = FakeStack()
    recovery = LockRecovery(hostname=HERE, foreign_gone=check)
    assert not recovery.recover_if_stale(stack=stack, message=locked(("replica-old", GONE_PID)))
    assert stack.cancels == 0


def test_a_failing_check_keeps_the_lock() -> None:
    def broken(host: str) -> bool:
        raise RuntimeError("apiserver unreachable")

    stack = FakeStack()
    assert not LockRecovery(hostname=HERE, foreign_gone=broken).recover_if_stale(
        stack=stack, message=locked(("replica-old", 7))
    )
    assert stack.cancels == 0


def test_this_hosts_locks_go_by_the_pid_and_never_ask_the_check() -> None:
    check = Check(gone={HERE})
    recovery = LockRecovery(hostname=HERE, foreign_gone=check)
    assert not recovery.stale(locked((HERE, os.getpid())))  # our own live process
    assert [lock.owner.pid for lock in recovery.stale(locked((HERE, GONE_PID)))] == [GONE_PID]
    assert check.asked == []


def test_one_live_holder_among_several_keeps_every_lock() -> None:
    recovery = LockRecovery(hostname=HERE, foreign_gone=Check(gone={"replica-old"}))
    assert not recovery.stale(locked(("replica-old", 7), (HERE, os.getpid())))
    assert len(recovery.stale(locked(("replica-old", 7), (HERE, GONE_PID)))) == 2


def locked_once(message: str) -> Callable[[], str]:
    """An operation that fails on the lock the first time and succeeds when run again."""
    calls = []

    def operation() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise auto.errors.ConcurrentUpdateError(CommandResult(stdout="", stderr=message, code=255))
        return "done"

    return operation


@pytest.mark.parametrize("gone", [True, False])
def test_the_engine_asks_its_configured_check_and_runs_again_only_after_a_recovery(
    tmp_path: Path, gone: bool
) -> None:
    check = Check(gone={"replica-old"} if gone else set())
    config = EngineConfig(
        backend_url=f"file://{tmp_path}", state_dir=tmp_path, hostname=HERE, foreign_lock_gone=check
    )
    engine, stack = Engine(config), FakeStack()
    operation = locked_once(locked(("replica-old", 7)))
    if gone:
        assert engine._retry_lock(stack, operation) == "done"  # type: ignore[arg-type]
    else:
        with pytest.raises(auto.errors.ConcurrentUpdateError):
            engine._retry_lock(stack, operation)  # type: ignore[arg-type]
    assert (check.asked, stack.cancels) == (["replica-old"], int(gone))
