"""Starting, waiting for and stopping a detached proxy process (`stacks.forward_proxy`) on this machine.

Recognising one (pid and start time, command line, listening ports) is `stacks/forward_proxy/identity.py`,
which the service's probe gate uses too.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

from stacks.forward_proxy.identity import MODULE, ProcessRef, holds_listener, is_running, start_time
from stacks.forward_proxy.loop import NICE_ENV, SCHED_ENV
from stacks.forward_proxy.shared_listener import FLAG as SHARED_FLAG

READY_TIMEOUT = 15.0
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
STOP_GRACE = 5.0
POLL = 0.05


class ProxyStartError(RuntimeError):
    """The proxy process exited or never accepted connections."""


def proxy_command(config_file: Path) -> list[str]:
    """Our filtering forward proxy (`stacks.forward_proxy`) on a 0600 config file (credentials and policy)."""
    return [sys.executable, "-m", MODULE, str(config_file)]


def shared_command(control_socket: str) -> list[str]:
    """The shared listener of one entry (`stacks/forward_proxy/shared_listener.py`) on its control socket."""
    return [sys.executable, "-m", MODULE, SHARED_FLAG, control_socket]


def accepts_within(host: str, port: int, *, timeout: float = READY_TIMEOUT) -> bool:
    """Does `host:port` accept a connection within `timeout` seconds?"""
    deadline = time.monotonic() + timeout
    while not _accepts(host, port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL)
    return True


def child_environment() -> dict[str, str]:
    """The proxy's whole environment: never the service's (passphrase, cloud keys), only what Python needs."""
    return {
        "PATH": os.defpath,
        "PYTHONPATH": PACKAGE_ROOT,  # `stacks` importable from any working directory
        "PYTHONUNBUFFERED": "1",  # the log shows the proxy's lines as they happen
        "LANG": "C.UTF-8",
        SCHED_ENV: "batch",  # not to preempt the service that wakes it (stacks/forward_proxy/loop.py)
    }


def spawn(command: list[str], *, log_path: Path) -> ProcessRef:
    """Start `command` in its own session (it outlives the Pulumi provider), output to `log_path`."""
    with open(log_path, "ab") as log, open(os.devnull, "rb") as devnull:
        actions = [
            (os.POSIX_SPAWN_DUP2, devnull.fileno(), 0),
            (os.POSIX_SPAWN_DUP2, log.fileno(), 1),
            (os.POSIX_SPAWN_DUP2, log.fileno(), 2),
        ]
        pid = os.posix_spawn(command[0], command, child_environment(), file_actions=actions, setsid=True)
        refused = _restore_priority(pid)
        if refused:
            log.write(f"proxy-operator: {refused}\n".encode())
    started = start_time(pid)
    if started is None:
        raise ProxyStartError(f"{command[0]} exited at once; see {log_path}")
    return ProcessRef(pid=pid, start_time=started)


def _restore_priority(pid: int) -> str | None:
    """Give a proxy started under a lowered priority (NICE_ENV) the one it was lowered from; what
    stood in the way, if anything (lowering a nice value needs CAP_SYS_NICE or an RLIMIT_NICE that allows
    it: without either the proxy keeps the engine host's priority, docs/operations.md)."""
    wanted = os.environ.get(NICE_ENV, "")
    try:
        nice = int(wanted)
    except ValueError:
        return None  # not started under a lowered priority (folder mode, a test's own program)
    if os.getpriority(os.PRIO_PROCESS, 0) <= nice:
        return None  # not lowered (or lowered by something other than the engine host): nothing to undo
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except ProcessLookupError:
        return None  # it exited at once: the caller says so
    except OSError as exc:
        return f"runs at the engine host's lowered priority: setting nice {nice} was refused ({exc.strerror})"
    return None


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def probe_host(bind: str) -> str:
    """Where to knock to see the listener: a wildcard bind answers on loopback."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(bind, bind)


def wait_until_listening(
    ref: ProcessRef,
    *,
    host: str,
    port: int,
    log_path: Path,
    log_offset: int = 0,
    timeout: float = READY_TIMEOUT,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_running(ref):
            raise ProxyStartError(f"the proxy exited before listening on {host}:{port}: {tail(log_path)}")
        if holds_listener(ref.pid, port) and _accepts(host, port):
            return
        time.sleep(POLL)
    stop(ref)
    raise ProxyStartError(
        f"the proxy did not listen on {host}:{port} within {timeout:.0f}s: {tail(log_path)}"
    )


def stop(ref: ProcessRef, *, grace: float = STOP_GRACE) -> None:
    """SIGTERM, then SIGKILL after `grace`; a process that is not ours (or gone) is left alone."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        if not is_running(ref):
            return
        try:
            os.kill(ref.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and is_running(ref):
            time.sleep(POLL)


def tail(path: Path, limit: int = 600) -> str:
    try:
        return path.read_text(errors="replace")[-limit:].strip() or "(log empty)"
    except OSError:
        return "(no log)"
