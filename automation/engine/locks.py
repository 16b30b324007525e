"""Recovering a stack lock whose owner process is gone.

A self-managed backend (file://, s3://, gs://) writes a lock file per running operation recording user,
host and pid; a crash or a kill leaves it behind and every later operation fails with "the stack is
currently locked". The CLI's error lists each lock as `<path>: created by <user>@<host> (pid <n>) at <t>`.
A lock taken on this host by a process that no longer exists cannot be released by anyone else, so we
cancel it (`pulumi cancel` deletes the lock file) and log that we did. Locks of live processes, or of other
hosts (another replica may still be running), are left alone: that stays a transient StackLocked error.
"""

from __future__ import annotations

import logging
import os
import re
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
class LockRecovery:
    hostname: str

    def stale(self, message: str) -> list[LockOwner]:
        """The locks in `message` that are ours to recover; empty if any lock is still owned."""
        owners = lock_owners(message)
        if not owners:
            return []
        if any(owner.host != self.hostname or process_alive(owner.pid) for owner in owners):
            return []
        return owners

    def recover_if_stale(self, *, stack: Cancellable, message: str) -> bool:
        owners = self.stale(message)
        if not owners:
            return False
        stack.cancel()
        for owner in owners:
            log.warning(
                "recovered stale lock of stack %s: %s was held by pid %d on %s, which is gone",
                stack.name,
                owner.path,
                owner.pid,
                owner.host,
                extra={"fields": {"stack": stack.name, "lock": owner.path, "pid": owner.pid}},
            )
        return True
