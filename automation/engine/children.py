"""Stopping our running `pulumi` children cleanly on shutdown.

SIGINT makes the CLI cancel the operation gracefully: it stops issuing new steps, waits for the ones in
flight, writes the checkpoint and releases the stack lock. A second SIGINT or a kill would leave the lock.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)


def pulumi_children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # /proc/<pid>/stat: "pid (comm) state ppid ..." -- comm may hold spaces, so split after ')'.
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == parent and comm == "pulumi":
            found.append(int(entry.name))
    return found


def interrupt_pulumi_children(*, parent: int, grace: float) -> int:
    """SIGINT each `pulumi` child of `parent`, then wait up to `grace` seconds for them to exit."""
    children = pulumi_children(parent)
    for pid in children:
        log.info("sending SIGINT to pulumi (pid %d) so it cancels cleanly", pid)
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(pid in pulumi_children(parent) for pid in children):
        time.sleep(0.1)
    return len(children)
