"""Plugins die with the Pulumi CLI that started them: the language host and the dynamic provider.

The CLI stops its plugins itself when it ends normally or is interrupted. When it is SIGKILLed (the
watchdog's last resort once a term is over, or a lost replica's process group), nothing stops them: they
are not the CLI's process group, so a call already running in them (a dynamic provider's Create) could
finish after the term ended, and its resource would be in no state. So each plugin watches its parent and
SIGKILLs itself the moment the parent is gone: a pidfd of the parent process (readable once every thread
of it has exited), not PR_SET_PDEATHSIG, which fires when the *thread* that forked the plugin exits (a Go
parent's threads come and go).

Imports only the standard library: a plugin starts with this before anything else.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time

POLL_SECONDS = 0.5  # only where pidfd_open is missing (Linux before 5.3)


def exit_with_parent() -> None:
    """Watch the parent from a daemon thread; SIGKILL this process once the parent has exited. A process
    whose parent is already gone (reparented before the watch began) is killed at once."""
    parent = os.getppid()
    try:
        pidfd: int | None = os.pidfd_open(parent)
    except (AttributeError, OSError):
        pidfd = None
    if parent == 1 or os.getppid() != parent:  # the parent died before the watch could hold it
        _die()
    target = _wait_pidfd if pidfd is not None else _poll_parent
    threading.Thread(
        target=target, args=(pidfd if pidfd is not None else parent,), daemon=True, name="parent-watch"
    ).start()


def _wait_pidfd(pidfd: int) -> None:
    while True:
        try:
            ready, _, _ = select.select([pidfd], [], [])
        except InterruptedError:
            continue
        if ready:
            _die()


def _poll_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_SECONDS)
    _die()


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
