"""Recognising a running forward proxy from /proc: the local program's `read` and the service's probe gate
(`service/health/listener.py`) ask the same questions here.

A process is identified by its pid AND its start time (field 22 of /proc/<pid>/stat), so a pid that the
kernel handed to some other program after ours died is never mistaken for our proxy, nor signalled. Its
instance id, the resource id the local program records and exports, is `<pid>-<start time>`.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MODULE = "stacks.forward_proxy"  # run as `python -m stacks.forward_proxy CONFIG.json`
LISTEN, SYN_RECV = b"0A", b"03"  # socket states in /proc/net/tcp
READ_SIZE = 1024  # a few lines of /proc/net/tcp per read
MAX_REMEMBERED = 100_000  # (pid, port) pairs `holds_listener` remembers
# (pid << 16 | port) -> (the socket's inode << 24 | its descriptor): two ints an entry, not two tuples and a
# string (the service probes 10,000 ports of 20 listeners: about 140 bytes a port less)
_HELD: dict[int, int] = {}
FD_BITS = 24
# The probe gate's memory of processes it found to be our proxy: pid -> (start time, when, on the monotonic
# clock). Within IDENTITY_SECONDS of that, a probe reads only the one descriptor that names the remembered
# listening socket (`listener_refusal`).
IDENTITY_SECONDS = 1.0
MAX_IDENTITIES = 4_096
_IDENTIFIED: dict[int, tuple[int, float]] = {}


@dataclass(frozen=True)
class ProcessRef:
    pid: int
    start_time: int

    @property
    def instance_id(self) -> str:
        return f"{self.pid}-{self.start_time}"

    @classmethod
    def from_instance_id(cls, value: str | None) -> ProcessRef | None:
        pid, _, started = (value or "").partition("-")
        if not (pid.isdigit() and started.isdigit()):
            return None
        return cls(pid=int(pid), start_time=int(started))


def start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot; None when gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    if fields[0] == "Z":
        _reap(pid)
        return None
    return int(fields[19])


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):  # not our child: its parent (or init) reaps it
        os.waitpid(pid, os.WNOHANG)


def is_running(ref: ProcessRef) -> bool:
    return start_time(ref.pid) == ref.start_time


def command_line(pid: int) -> list[str]:
    """The arguments `pid` runs with; empty when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def runs_forward_proxy(pid: int) -> bool:
    args = command_line(pid)
    return any(args[i : i + 2] == ["-m", MODULE] for i in range(len(args) - 1))


def is_ours(ref: ProcessRef) -> bool:
    """The recorded process still runs, and it runs our forward proxy (not a program that got its pid)."""
    return is_running(ref) and runs_forward_proxy(ref.pid)


def holds_listener(pid: int, port: int) -> bool:
    """`pid` itself holds a listening TCP socket on `port` (from /proc, no external tools).

    A shared listener holds thousands of sockets, and the probe gate asks before every probe: reading all
    its descriptors and the listening table each time cost milliseconds at 10,000 ports. So what a scan
    found is remembered, per process and port, as the descriptor and the socket's inode; the next check
    reads that one descriptor and holds only while it still names that very socket (a listening socket
    keeps its port; closed, its descriptor names another inode or nothing, and the process is scanned
    again). One scan of a process fills in every port it listens on."""
    if holds_known_listener(pid, port):
        return True
    _HELD.pop(pid << 16 | port, None)  # gone or another socket now: scanned again
    held = _scan(pid)
    if len(_HELD) + len(held) > MAX_REMEMBERED:
        _HELD.clear()  # bounded: processes come and go
    _HELD.update(
        (pid << 16 | p, int(inode) << FD_BITS | fd) for p, (fd, inode) in held.items() if fd >> FD_BITS == 0
    )
    return port in held


def holds_listener_uncached(pid: int, port: int) -> bool:
    """`holds_listener` without the memory: every descriptor and the listening table read on each call
    (the check as it was before the shared listener; the bench compares the two)."""
    return port in _scan(pid)


def holds_known_listener(pid: int, port: int) -> bool:
    """`pid` holds the very listening socket on `port` that a scan found before: one `readlink`, no scan.
    False says only that this quick check cannot tell (never scanned, or the descriptor names something
    else now)."""
    known = _HELD.get(pid << 16 | port)
    if known is None:
        return False
    fd, inode = known & ((1 << FD_BITS) - 1), known >> FD_BITS
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]"
    except OSError:
        return False


def _scan(pid: int) -> dict[int, tuple[int, str]]:
    """Every port `pid` listens on itself: port -> (descriptor, socket inode)."""
    sockets: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    sockets[target[len("socket:[") : -1]] = int(fd.name)
    held: dict[int, tuple[int, str]] = {}
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for port, inode in _listeners(Path(f"/proc/{pid}/net/{table}")):
                if inode in sockets:
                    held[port] = (sockets[inode], inode)
    return held


def _listeners(table: Path) -> Iterator[tuple[int, str]]:
    """(port, inode) of each listening socket in a /proc/net/tcp table. The kernel lists them first, then
    walks every slot of the connection table (a millisecond or more, however few connections there are),
    and it makes only as many lines as a read asks for: so small reads, and a stop where the listeners end."""
    with table.open("rb", buffering=READ_SIZE) as lines:
        next(lines, None)  # the header
        for line in lines:
            fields = line.split()
            if fields[3] == LISTEN:
                yield int(fields[1].rsplit(b":", 1)[1], 16), fields[9].decode()
            elif fields[3] != SYN_RECV:  # older kernels list pending connections among the listeners
                return


def listener_refusal(ref: ProcessRef, *, port: int, now: float | None = None) -> str | None:
    """Why the listener on `port` is not known to be the recorded proxy process; None when it is: that
    process runs, runs our forward proxy, and holds the listening socket itself (so nobody else can).

    The service asks before every probe (1,000 a second at 10,000 proxies over a few shared listeners), and
    reading the process's stat and command line each time was 7.5 % of its event loop. So once a process
    passed every check, for IDENTITY_SECONDS after it a probe checks only that the process still holds the
    remembered socket (one `readlink` of its descriptor). That alone cannot pass anybody else: a process
    that is gone has no descriptors, and a later process given the same pid has no descriptor naming our
    socket's inode (a socket's inode is its own while it exists). Whatever that quick check cannot confirm
    goes through every check again, so a refusal and its reason come at once, as before."""
    now = time.monotonic() if now is None else now
    seen = _IDENTIFIED.get(ref.pid)
    if (
        seen is not None
        and seen[0] == ref.start_time
        and now - seen[1] < IDENTITY_SECONDS
        and holds_known_listener(ref.pid, port)
    ):
        return None
    if not is_running(ref):
        return f"its process (pid {ref.pid}) is gone"
    if not runs_forward_proxy(ref.pid):
        return f"pid {ref.pid} now runs another program"
    if not holds_listener(ref.pid, port):
        return f"its process (pid {ref.pid}) does not listen on port {port}"
    if len(_IDENTIFIED) >= MAX_IDENTITIES:
        _IDENTIFIED.clear()  # bounded: processes come and go
    _IDENTIFIED[ref.pid] = (ref.start_time, now)
    return None
