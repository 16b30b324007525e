"""The service's side of the engine host (`automation/engine/host.py`): an engine whose calls run in a child
process of the term, started on the first call and closed when idle.

Why: the Pulumi SDK the Automation API needs (gRPC, protobuf, the `pulumi` runtime) and the gRPC servers of
its running `up`s are about 19 MiB of the service's RSS, for work that happens in bursts (a term's backend
read, a change's `up`); the host takes them out of the service's process and gives them back to the
system when it exits (docs/decisions.md, "The engine host process").

The fence is the term's, unchanged (`automation/engine/term.py`): the host is started through
`Term.spawn` (refused once the term ended or outside its deadline; the term's `before_operation`, the
operations heartbeat, runs first), so the term counts it as a child: `busy()` while it lives, its deadline
told to it at each `extend`, SIGINT at `end()` and SIGKILL after the grace. The host passes each of these on
to its own CLI calls (host.py).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import subprocess
import sys
import threading
from concurrent.futures import Future
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from automation.engine.term import Child, Term, TermEndedError
from automation.errors import TransientError

if TYPE_CHECKING:
    from automation.engine.core import Engine

log = logging.getLogger(__name__)

HOST_ARGS = ["engine-host"]  # how the term sees the host among its children: an operation (unknown word)
CLOSED = b"closed\n"  # on the keepalive pipe: the term closed, the host's own term refuses operations now
# The Engine methods a service may call through the host: those that only read, and those that operate
# (refused here once the term has closed, before they reach the host).
READ_METHODS = frozenset(
    {"list_stack_names", "info", "outputs", "export", "export_stored", "plain_outputs", "stack_tags"}
)
OPERATION_METHODS = frozenset(
    {"up", "preview", "preview_destroy", "detect_drift", "destroy", "forget", "set_owner"}
)
READS = "reads-only"  # the name of a host outside any term: its own term is closed from the start


class HostExitedError(TransientError):
    """The engine host exited before it answered (killed, or its term ended): the call is not lost, the
    next one starts another host (within the term) and the work is retried."""

    default_reason = "EngineHostExited"


class _Process:
    """One running host: its pipes, its calls in flight, and the thread that reads its replies."""

    def __init__(self, child: Child, calls: Connection, replies: Connection) -> None:
        self.child, self.calls, self.replies = child, calls, replies
        self.pending: dict[int, Future[Any]] = {}
        self.closed = False


class EngineHost:
    """Runs `Engine` calls of one term in a host process (see the module's docstring)."""

    def __init__(self, engine: Engine, term: Term | None, *, idle_seconds: float, grace: float) -> None:
        """`term` None: a host for the calls made outside any term (a follower's `/v1/stacks`), whose own
        term is closed from its start: it runs reads and refuses every operation, as a fenced engine
        outside a term does. It dies with this process (its keepalive pipe) and when idle."""
        self.engine, self.term = engine, term
        self.name = term.name if term is not None else READS
        self.idle_seconds, self.grace = idle_seconds, grace
        self._lock = threading.Lock()
        self._process: _Process | None = None
        self._ids = itertools.count(1)
        self._idle_timer: threading.Timer | None = None
        self._written: dict[str, tuple[str, str]] = {}  # the host's config cache, for the term's next host
        self.started = 0  # hosts started (for tests and the log)
        if term is not None:
            term.on_close(self._term_closed)

    # --- calls ------------------------------------------------------------------------------------------

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run `engine.<method>(*args, **kwargs)` in the host; its result, or its error raised here."""
        if method in OPERATION_METHODS and self.term is not None and self.term.ended:
            raise TermEndedError(f"term {self.name} has ended: `{method}` was not started")
        with self._lock:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            number = next(self._ids)
            answer = Future[Any]()
            for attempt in (1, 2):  # a host that died before it read the call: the call is sent to another
                process = self._running()
                process.pending[number] = answer
                try:
                    process.calls.send(("call", number, method, args, kwargs))
                    break
                except (OSError, ValueError) as exc:
                    process.pending.pop(number, None)
                    process.closed = True
                    if self._process is process:
                        self._process = None
                    if attempt == 2:
                        raise HostExitedError(f"the engine host of term {self.name} is gone: {exc}") from exc
        try:
            return answer.result()
        finally:
            with self._lock:
                process.pending.pop(number, None)
                if not process.pending and process is self._process and not process.closed:
                    self._idle_timer = threading.Timer(self.idle_seconds, self._close_if_idle, (process,))
                    self._idle_timer.daemon = True
                    self._idle_timer.start()

    def _term_closed(self) -> None:
        """The term closed: the live host's own term closes too (its calls in flight start no operation)."""
        with self._lock:
            process = self._process
        if process is not None:
            with contextlib.suppress(OSError):  # the host has exited: nothing to tell
                os.write(process.child.keepalive, CLOSED)

    def close(self) -> None:
        """Close the host when nothing runs in it (a term view given up); the term's end stops it anyway."""
        with self._lock:
            process = self._process
        if process is not None:
            self._close_if_idle(process)

    def _close_if_idle(self, process: _Process) -> None:
        with self._lock:
            if process.pending or process.closed:
                return
            process.closed = True
            if self._process is process:
                self._process = None
        log.debug("engine host of term %s idle for %g s: closed", self.name, self.idle_seconds)
        with contextlib.suppress(OSError):
            process.calls.close()  # the host sees the end of its calls and exits

    # --- the process --------------------------------------------------------------------------------------

    def _running(self) -> _Process:
        """The live host, started (under the term, which may refuse) when there is none. Under the lock."""
        if self._process is not None and not self._process.closed:
            return self._process
        calls_read, calls_write = os.pipe()
        replies_read, replies_write = os.pipe()

        def start(valid_until: float) -> tuple[subprocess.Popen[str], int]:
            keep_read, keep_write = os.pipe()
            try:
                process = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "automation.engine.host",
                        str(calls_read),
                        str(replies_write),
                        str(keep_read),
                        repr(valid_until),
                        self.term.name if self.term is not None else "",
                        repr(self.grace),
                    ],
                    stdin=subprocess.DEVNULL,
                    env=_host_environment(),
                    pass_fds=(calls_read, replies_write, keep_read),
                    text=True,
                )
            except BaseException:
                os.close(keep_write)
                raise
            finally:
                os.close(keep_read)
            return process, keep_write

        try:
            if self.term is not None:
                child = self.term.spawn(start, HOST_ARGS)
            else:
                process, keepalive = start(math.inf)
                child = Child(process=process, args=HOST_ARGS, keepalive=keepalive)
        except BaseException:
            for fd in (calls_write, replies_read):
                os.close(fd)
            raise
        finally:
            for fd in (calls_read, replies_write):
                os.close(fd)
        running = _Process(
            child, Connection(calls_write, readable=False), Connection(replies_read, writable=False)
        )
        config = self.engine.config
        running.calls.send(
            {
                "config": replace(config, foreign_lock_gone=None, host_idle_seconds=0.0),
                "ask_foreign": config.foreign_lock_gone is not None,
                "written": dict(self._written),
                "version": self.engine._runner.known_version(),
                "log_level": logging.getLogger("automation").getEffectiveLevel(),
                "workers": max(4, config.parallel * 2),
            }
        )
        self._process = running
        self.started += 1
        threading.Thread(
            target=self._read, args=(running,), name=f"engine-host-{child.process.pid}", daemon=True
        ).start()
        log.info("engine host of term %s started (pid %d)", self.name, child.process.pid)
        return running

    def _read(self, process: _Process) -> None:
        """The host's replies, questions and log records, until it exits; then the term hears of its end."""
        try:
            while True:
                try:
                    message = process.replies.recv()
                except (EOFError, OSError):
                    break
                kind = message[0]
                if kind == "result":
                    _, number, ok, value, written = message
                    self._written = written
                    answer = process.pending.get(number)
                    if answer is not None:
                        if ok:
                            answer.set_result(value)
                        else:
                            answer.set_exception(value)
                elif kind == "ask":
                    _, number, holder = message
                    threading.Thread(target=self._answer, args=(process, number, holder), daemon=True).start()
                elif kind == "log":
                    _, name, level, text, fields = message
                    extra = {"fields": fields} if fields else None
                    logging.getLogger(name).log(level, "%s", text, extra=extra)
        finally:
            with self._lock:
                process.closed = True  # no call is sent to it any more
                if self._process is process:
                    self._process = None
            code = process.child.process.wait()
            if self.term is not None:
                self.term.finished(process.child)
            else:
                with contextlib.suppress(OSError):
                    os.close(process.child.keepalive)
            with self._lock:
                left = list(process.pending.values())
            for answer in left:
                if not answer.done():
                    answer.set_exception(
                        HostExitedError(f"the engine host of term {self.name} exited (status {code})")
                    )
            with contextlib.suppress(OSError):
                process.replies.close()
            with contextlib.suppress(OSError):
                process.calls.close()
            log.debug("engine host of term %s exited (status %s)", self.name, code)

    def _answer(self, process: _Process, number: int, holder: str) -> None:
        gone = self.engine.config.foreign_lock_gone
        try:
            value = bool(gone(holder)) if gone is not None else False
        except Exception:
            log.warning("cannot tell whether %s is gone; its lock stays", holder, exc_info=True)
            value = False
        with contextlib.suppress(OSError, ValueError), self._lock:
            process.calls.send(("answer", number, value))


def _host_environment() -> dict[str, str]:
    """The service's environment, with the folder holding this package first on the host's import path:
    `-m automation.engine.host` finds the same code whatever the service's working folder."""
    root = Path(__file__).resolve().parents[2]
    if root.name in ("site-packages", "dist-packages"):  # installed: every interpreter of it finds it
        return dict(os.environ)
    paths = [
        str(root),
        *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(root)),
    ]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
