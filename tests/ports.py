"""Loopback ports for servers that a test hands to another process (a proxy, etcd, an API server).

A port from ``bind(("127.0.0.1", 0))`` lies in the kernel's ephemeral range, where every outgoing
connection and every Pulumi gRPC server (they all bind port 0) may take it before the child binds it: a
CI run was lost to that (the local proxy exited with EADDRINUSE on a port the test had just picked). So
ports come from below the ephemeral range, each one is held by an ``flock`` for the life of the test
process so two pytest runs on one machine never share it, and each is checked bindable before it is
handed out. A port is handed out once per process; a test that restarts a server reuses its own number.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
import threading
from pathlib import Path

_LOCKS = Path(tempfile.gettempdir()) / "proxy-operator-test-ports"
_FLOOR = 15000  # above the well-known and registered ports most daemons use
_SPAN = 12000
_held: dict[int, int] = {}  # port -> the open lock file descriptor that keeps it ours
_guard = threading.Lock()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _candidates(width: int = 1) -> list[int]:
    """First ports of `width` consecutive ones below the ephemeral range, in random order (two runs starting
    together do not walk the same order)."""
    low = _ephemeral_low()
    top = low - 1 if low - 1 > _FLOOR + 1000 else _FLOOR + _SPAN
    ports = list(range(max(_FLOOR, top - _SPAN), top - width + 2))
    random.shuffle(ports)
    return ports


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _claim(port: int) -> bool:
    _LOCKS.mkdir(exist_ok=True)
    fd = os.open(_LOCKS / str(port), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    if not _bindable(port):
        os.close(fd)
        return False
    _held[port] = fd  # closed (and so released) when the process exits
    return True


def _release(port: int) -> None:
    os.close(_held.pop(port))


def free_port() -> int:
    """A loopback TCP port outside the ephemeral range, free now and reserved for this process."""
    return free_range(1)


def free_range(width: int) -> int:
    """The first of `width` consecutive loopback ports outside the ephemeral range, all free now and
    reserved for this process (children on a shared host take ports upwards from a base)."""
    with _guard:
        for base in _candidates(width):
            claimed = []
            for port in range(base, base + width):
                if port in _held or not _claim(port):
                    break
                claimed.append(port)
            else:
                return base
            for port in claimed:
                _release(port)
    raise RuntimeError(f"no {width} free loopback ports below the ephemeral range (lock files in {_LOCKS})")
