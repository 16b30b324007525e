"""The service's stall warnings (service/loop_stalls.py) in a bench window: read from its log, summed. And
the window's drift checks (automation/reconciler.py): answered from /proc, or a Pulumi refresh.

Each warning covers the stalls since the one before; the summary adds them up and ranks the loop's stacks
by their samples over the window, so that what holds the loop most is first."""

from __future__ import annotations

import collections
import re
from pathlib import Path

MARK = "event loop held "
_HEAD = re.compile(r"held (\d+) time\(s\) since the last warning, longest (\d+) ms, (\d+) ms in all")
_SCHED = re.compile(r"its thread on a CPU (\d+) ms, waiting for one (\d+) ms")
_SAMPLE = re.compile(r"(.+?) \((\d+)x\)$")


def log_size(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


def _read(log: Path, since: int) -> str:
    with log.open("rb") as f:
        f.seek(since)
        return f.read().decode(errors="replace")


def drift_checks(log: Path, since: int) -> str:
    """A line to print: the drift checks in `log` after byte `since`, by how they were answered."""
    text = _read(log, since) if log.exists() else ""
    answered = text.count("holds its port (no refresh)")
    refreshed = text.count("drift check of stack ") - answered
    return f"  drift checks: {answered} answered from /proc, {refreshed} by a refresh"


def summary(log: Path, since: int, *, top: int = 5) -> list[str]:
    """Lines to print: the stalls in `log` after byte `since`, and the loop's most sampled stacks."""
    if not log.exists():
        return []
    text = _read(log, since)
    stalls, longest, held, on_cpu, waiting = 0, 0, 0, 0, 0
    stacks: collections.Counter[str] = collections.Counter()
    busy: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        head = _HEAD.search(line)
        if head is None:
            continue
        stalls += int(head[1])
        longest = max(longest, int(head[2]))
        held += int(head[3])
        sched = _SCHED.search(line)
        if sched:
            on_cpu += int(sched[1])
            waiting += int(sched[2])
        loop_part, _, busy_part = line.partition("; busy threads: ")
        for part, into in ((loop_part.partition("loop at (samples): ")[2], stacks), (busy_part, busy)):
            for item in part.split("; "):
                sample = _SAMPLE.match(item.strip())
                if sample:
                    into[sample[1]] += int(sample[2])
    if not stalls:
        return ["  loop stalls: none over the threshold"]
    found = [
        f"  loop stalls: {stalls}, longest {longest} ms, {held / 1000:.1f} s in all; its thread on a CPU "
        f"{on_cpu / 1000:.1f} s of it, waiting for one {waiting / 1000:.1f} s; the loop at:"
    ]
    found += [f"    {n:4d}x {stack}" for stack, n in stacks.most_common(top)]
    if busy:
        found.append("  busy threads beside it (samples):")
        found += [f"    {n:4d}x {where}" for where, n in busy.most_common(top)]
    return found
