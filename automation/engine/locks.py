"""Recovering a stack lock whose owner process is gone.

A self-managed backend (file://, s3://, gs://) writes a lock file per running operation recording user,
host and pid; a crash or a kill leaves it behind and every later operation fails with "the stack is
currently locked". The CLI's error lists each lock as `<path>: created by <user>@<host> (pid <n>) at <t>`.
A lock taken on this host by a process that no longer exists cannot be released by anyone else, so we
cancel it (`pulumi cancel` deletes the lock file) and log that we did. A lock of another host (in a cluster:
another replica, the host being its pod name) is cancelled only when the injected `foreign_gone(host)`
answers True (the service asks the Lease and the pods); without it, or when it answers False, the lock is
left alone and stays a transient StackLocked error. Locks of live processes on this host are left alone.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

_LOCK_LINE = re.compile(r"(?P<path>\S+): created by (?P<user>[^@\s]*)@(?P<host>\S+) \(pid (?P<pid>\d+)\)")


class Cancellable(Protocol):
    name: str

    def cancel(self) -> None: ...


@dataclass(frozen=True)
class LockOwner:
    path: str
    user: str
    host: str
    pid: int


def lock_owners(message: str) -> list[LockOwner]:
    return [
        LockOwner(path=m["path"], user=m["user"], host=m["host"], pid=int(m["pid"]))
        for m in _LOCK_LINE.finditer(message)
    ]


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class StaleLock:
    owner: LockOwner
    why: str


@dataclass(frozen=True)
class LockRecovery:
    hostname: str
    foreign_gone: Callable[[str], bool] | None = None  # given another host's name: is it gone for good?

    def stale(self, message: str) -> list[StaleLock]:
        """The locks in `message` that are ours to recover; empty if any lock may still be owned."""
        found = []
        for owner in lock_owners(message):
            why = self._why_stale(owner)
            if why is None:
                return []
            found.append(StaleLock(owner, why))
        return found

    def _why_stale(self, owner: LockOwner) -> str | None:
        if owner.host == self.hostname:
            return None if process_alive(owner.pid) else f"pid {owner.pid} on this host is gone"
        if self.foreign_gone is None:
            return None
        try:
            gone = self.foreign_gone(owner.host)
        except Exception:  # a failing check must not turn into a cancel, nor hide the lock error
            log.exception("cannot tell whether %s, holding a stack lock, is gone", owner.host)
            return None
        return (
            f"its holder {owner.host} is gone (no longer leader, pod gone or lease expired)" if gone else None
        )

    def recover_if_stale(self, *, stack: Cancellable, message: str) -> bool:
        stale = self.stale(message)
        if not stale:
            return False
        stack.cancel()
        for lock in stale:
            log.warning(
                "recovered stale lock of stack %s: %s was held by %s@%s (pid %d): %s",
                stack.name,
                lock.owner.path,
                lock.owner.user,
                lock.owner.host,
                lock.owner.pid,
                lock.why,
                extra={
                    "fields": {
                        "stack": stack.name,
                        "lock": lock.owner.path,
                        "host": lock.owner.host,
                        "pid": lock.owner.pid,
                        "why": lock.why,
                    }
                },
            )
        return True
