"""One `local` entry's shared listener as its provider sees it: its files in the state folder, the lock
that lets one create at a time start it or add to it, and a blocking client of its control socket.

Files, named after the entry (a proxy's stem never starts with `_`): `_shared-<entry>.ctl` (the control
socket: `shared_listener.py` says what it answers), `.log`, `.pid` (the process, `{"pid", "start_time"}`,
written as soon as it is started) and `.lock` (an `flock`: the dynamic provider runs creates and deletes
on several threads, and a create that starts the listener, or a delete that stops it with its last proxy,
must not cross another create).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stacks.forward_proxy import identity
from stacks.forward_proxy.control import MAX_LINE, socket_path
from stacks.programs import local_process as proc

CALL_TIMEOUT = 10.0


class SharedListenerError(RuntimeError):
    """The shared listener could not be reached, or refused the request (its reason in the message)."""


class SharedListener:
    def __init__(self, state_dir: Path, entry: str) -> None:
        self.state_dir = state_dir
        stem = f"_shared-{entry}"
        control = socket_path(state_dir, stem)
        if control is None:
            raise SharedListenerError(
                f"stateDir {state_dir} is too deep for the shared listener's control socket (a unix socket "
                "path holds at most 107 bytes): set a shorter stateDir on the entry"
            )
        self.control = control
        self.log_path = state_dir / f"{stem}.log"
        self._record = state_dir / f"{stem}.pid"
        self._lock = state_dir / f"{stem}.lock"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self._lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def is_ours(self, ref: proc.ProcessRef | None) -> bool:
        """`ref` still runs, and runs this entry's shared listener (not a proxy, not another program)."""
        return (
            ref is not None
            and proc.is_running(ref)
            and identity.command_line(ref.pid)[-4:] == proc.shared_command(self.control)[-4:]
        )

    def running(self) -> proc.ProcessRef | None:
        """The recorded listener when it still runs (under `locked`)."""
        try:
            recorded = json.loads(self._record.read_text())
            ref = proc.ProcessRef(pid=int(recorded["pid"]), start_time=int(recorded["start_time"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return ref if self.is_ours(ref) else None

    def ensure(self) -> proc.ProcessRef:
        """The running listener, started first when there is none (under `locked`)."""
        return self.running() or self._start()

    def stop(self, ref: proc.ProcessRef) -> None:
        """Stop the listener (under `locked`, with its last proxy dropped)."""
        proc.stop(ref)
        self._record.unlink(missing_ok=True)
        Path(self.control).unlink(missing_ok=True)  # it removes it on a clean exit; not after a SIGKILL

    def call(self, request: dict[str, Any], *, timeout: float = CALL_TIMEOUT) -> dict[str, Any]:
        """One request; its answer when ok, else a SharedListenerError with the listener's reason."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(self.control)
                sock.sendall(json.dumps(request).encode() + b"\n")
                with sock.makefile("rb") as answers:
                    line = answers.readline(MAX_LINE)
        except OSError as exc:
            raise SharedListenerError(f"shared listener {self.control}: {exc}") from exc
        try:
            answer = json.loads(line)
        except ValueError as exc:
            raise SharedListenerError(f"shared listener {self.control}: no answer") from exc
        if not isinstance(answer, dict) or answer.get("ok") is not True:
            error = answer.get("error") if isinstance(answer, dict) else answer
            raise SharedListenerError(f"shared listener {self.control}: {error}")
        return answer

    def _start(self) -> proc.ProcessRef:
        ref = proc.spawn(proc.shared_command(self.control), log_path=self.log_path)
        self._record.write_text(json.dumps({"pid": ref.pid, "start_time": ref.start_time}))
        deadline = time.monotonic() + proc.READY_TIMEOUT
        while time.monotonic() < deadline:
            if not proc.is_running(ref):
                raise proc.ProxyStartError(f"the shared listener exited at start: {proc.tail(self.log_path)}")
            with contextlib.suppress(SharedListenerError):
                self.call({"op": "hello"}, timeout=1.0)
                return ref
            time.sleep(proc.POLL)
        self.stop(ref)
        raise proc.ProxyStartError(
            f"the shared listener did not answer on {self.control} within {proc.READY_TIMEOUT:.0f}s: "
            f"{proc.tail(self.log_path)}"
        )
