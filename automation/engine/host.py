"""The engine host: a process that runs one leadership term's Pulumi operations, so the service never loads
the SDK (docs/decisions.md, "The engine host process").

    python -m automation.engine.host CALLS REPLIES KEEPALIVE VALID_UNTIL TERM GRACE

Started by `automation.engine.hosted` as a child of the term (`Term.spawn`): the term counts it among its
children, tells it each extension of its deadline and SIGINTs it when it ends. Inside, the same rules hold
one level down: the host's own `Term` (named as the leader's) is the term of every CLI call it makes, each
under its watchdog, so

- the leader's renewals reach the host on KEEPALIVE (one monotonic deadline a line, as a watchdog reads
  them) and go on to every running CLI; a frozen leader renews nothing and the CLIs' watchdogs interrupt
  them at the deadline;
- `closed` on KEEPALIVE (the term closed in the service: `Term.close`, the first step of its end) closes the
  host's own term: its calls in flight start no operation any more (reads go on);
- KEEPALIVE closing (the service exited or was killed, even by SIGKILL) or a SIGINT/SIGTERM (the term
  ended) ends the host's term: no CLI starts any more, the running ones are interrupted and killed after
  GRACE seconds, and the host exits;
- CALLS closing (the service found the host idle) lets the calls in flight finish (there are none: the
  service closes only an idle host) and the host exits.

CALLS and REPLIES carry pickled tuples (`multiprocessing.connection` frames) between two processes of the
same installation: calls of `Engine` methods and their results or errors; the host's questions to the
service (is a foreign lock's holder gone?); its log records.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import pickle
import signal
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from automation.engine.core import Engine
from automation.engine.hosted import CLOSED, OPERATION_METHODS, READ_METHODS
from automation.engine.term import Term
from automation.errors import TransientError
from stacks.forward_proxy.loop import NICE_ENV

log = logging.getLogger(__name__)

METHODS = READ_METHODS | OPERATION_METHODS  # what a service may call through the host (nothing else)


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives a pickle round trip, else a TransientError that says what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return TransientError(f"{type(exc).__name__}: {exc}", reason="EngineHostError")
    return exc


class _Forwarder(logging.Handler):
    """Sends each log record to the service, which logs it through its own handlers."""

    def __init__(self, send: Any) -> None:
        super().__init__()
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            fields = getattr(record, "fields", None)  # the structured log's (`extra={"fields": ...}`)
            self._send(
                ("log", record.name, record.levelno, message, fields if isinstance(fields, dict) else None)
            )
        except Exception:  # the service is gone: nobody to tell
            pass


class Host:
    """The host's side of the pipes: runs calls in threads, answers, asks, ends with its term."""

    def __init__(self, calls: Connection, replies: Connection, term: Term, grace: float) -> None:
        self.calls, self.replies, self.term, self.grace = calls, replies, term, grace
        self._send_lock = threading.Lock()
        self._asks: dict[int, Future[Any]] = {}
        self._ask_ids = itertools.count(1)
        self._ending = threading.Event()
        self.engine: Engine | None = None

    def send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            self.replies.send(message)

    def ask_foreign_gone(self, holder: str) -> bool:
        """The service's answer to "is the replica `holder` gone for good?" (its Lease and pods)."""
        asked = Future[Any]()
        number = next(self._ask_ids)
        self._asks[number] = asked
        try:
            self.send(("ask", number, holder))
            return bool(asked.result(timeout=60))
        finally:
            self._asks.pop(number, None)

    def start(self, init: dict[str, Any]) -> None:
        config = init["config"]
        if init.get("ask_foreign"):
            config = replace(config, foreign_lock_gone=self.ask_foreign_gone)
        engine = Engine(config)
        if init.get("version"):
            engine._runner.seed(init["version"])
        self.engine = engine.in_term(self.term)
        engine._written.adopt(init.get("written") or {}, self.term)

    def run_call(self, number: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        assert self.engine is not None
        try:
            if method not in METHODS:
                raise TransientError(f"the engine host has no call {method!r}", reason="EngineHostError")
            value = getattr(self.engine, method)(*args, **kwargs)
            reply: tuple[Any, ...] = ("result", number, True, value, self.engine._written.entries())
        except BaseException as exc:
            reply = ("result", number, False, portable(exc), self.engine._written.entries())
        with contextlib.suppress(OSError, ValueError):
            self.send(reply)

    def end(self, why: str) -> None:
        """End the term (no CLI starts, the running ones interrupted), then exit. Once."""
        if self._ending.is_set():
            return
        self._ending.set()

        def ending() -> None:
            log.info("engine host of term %s: %s; its operations are interrupted", self.term.name, why)
            self.term.end(grace=self.grace)
            os._exit(0)

        threading.Thread(target=ending, name="host-end", daemon=True).start()

    def keep(self, fd: int) -> None:
        """The leader's renewals; the pipe closing means the service is gone."""
        with os.fdopen(fd, "rb", buffering=0) as pipe:
            pending = b""
            while chunk := pipe.read(256):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line == CLOSED.strip():
                        self.term.close()  # the service's term closed: no operation starts here either
                        continue
                    with contextlib.suppress(ValueError):
                        self.term.extend(float(line))
        self.end("the service is gone")

    def serve(self, workers: int) -> None:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="host-call") as pool:
            while True:
                try:
                    message = self.calls.recv()
                except (EOFError, OSError):
                    break  # the service closed an idle host (or is gone: the keepalive says which)
                if message[0] == "call":
                    _, number, method, args, kwargs = message
                    pool.submit(self.run_call, number, method, args, kwargs)
                elif message[0] == "answer":
                    _, number, value = message
                    asked = self._asks.get(number)
                    if asked is not None:
                        asked.set_result(value)


def main(argv: list[str]) -> int:
    calls_fd, replies_fd, keepalive_fd = (int(arg) for arg in argv[:3])
    valid_until, name, grace = float(argv[3]), argv[4], float(argv[5])
    calls = Connection(calls_fd, writable=False)
    replies = Connection(replies_fd, readable=False)
    term = Term(name or "reads-only", valid_until=valid_until)
    if not name:
        term.close()  # outside any term (hosted.READS): reads only, every operation refused
    host = Host(calls, replies, term, grace)
    init = calls.recv()
    _yield_cpu(init["config"].host_nice)  # before any thread: each thread, and each child, inherits it
    root = logging.getLogger()
    root.handlers[:] = [_Forwarder(host.send)]
    root.setLevel(init.get("log_level", logging.INFO))
    signal.signal(signal.SIGINT, lambda _s, _f: host.end("the term ended"))
    signal.signal(signal.SIGTERM, lambda _s, _f: host.end("the term ended"))
    threading.Thread(target=host.keep, args=(keepalive_fd,), name="host-keepalive", daemon=True).start()
    host.start(init)
    host.send(("ready",))
    host.serve(workers=max(4, int(init.get("workers", 32))))
    return 0


def _yield_cpu(nice: int) -> None:
    """Lower this process's priority by `nice` (never refused: only raising it needs a privilege). The
    `local` proxies an `up` starts are put back at the service's where that is allowed (their traffic is
    the product, not Pulumi's work): the variable tells them which (stacks/programs/local_process.py)."""
    if nice > 0:
        try:
            own = os.nice(0)
            os.nice(nice)
        except OSError as exc:  # a platform without it: the same priority as the service, as before
            log.warning("the engine host keeps its priority: nice refused (%s)", exc)
        else:
            os.environ[NICE_ENV] = str(own)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
