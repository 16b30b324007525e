"""Terms: who may run a `pulumi` operation, and until when. The fence of "one writer per stack".

Every CLI call the engine makes belongs to a term (`Engine.in_term`). A term is the span in which one
replica may act on the stacks: in a cluster one leadership term, in folder mode or a one-shot command the
life of the controller. The command runner (`automation.engine.command`) is the one place a `pulumi`
process starts, and it asks the term first:

- An **operation** (anything that takes the stack lock or writes the backend: up, destroy, refresh,
  cancel, stack import, state edits, stack init/rm, tag writes) is refused once the term has ended, and
  before it started on an engine that is fenced (the in-cluster engine: no operation outside a term).
  Reads (stack ls/select/output/export/history, tag ls, version) run in any term and outside one, so
  followers keep serving `/v1/stacks`.
- Each child is registered under the term's lock before it can run, so `end()` sees every child that
  will ever exist for the term: it refuses new ones, SIGINTs the live ones (the CLI cancels cleanly and
  releases its lock), and waits until none is left, SIGKILLing what outlives the grace.
- Each child runs under a watchdog (`automation/engine/watchdog.py`) holding the read end of a pipe: it
  interrupts the CLI when the pipe closes (this process died, even by SIGKILL) or when the term's deadline
  passes without being extended (this process is frozen: SIGSTOP, a stuck node). A leader's term is
  extended at each Lease renewal, to the renew deadline, so no child it started outlives the moment
  another replica may take over.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from automation.errors import TransientError

log = logging.getLogger(__name__)

# Subcommands that only read (the first word, or the first two for `stack ...`/`stack tag ...`).
_READS = {"version", "whoami", "about", "plugin"}
_STACK_READS = {"ls", "select", "output", "export", "history"}


def is_operation(args: list[str]) -> bool:
    """Does this CLI call take the stack lock or write the backend? Unknown calls count as operations."""
    words = [arg for arg in args if not arg.startswith("-")]
    if not words:
        return False
    if words[0] in _READS:
        return False
    if words[0] == "config":
        return False  # stack config lives in the work directory's Pulumi.<stack>.yaml, not the backend
    if words[0] == "stack" and len(words) > 1:
        if words[1] in _STACK_READS:
            return False
        if words[1] == "tag" and len(words) > 2 and words[2] in ("ls", "get"):
            return False
    return True


class TermEndedError(TransientError):
    """An operation was asked of a term that has ended (or, on a fenced engine, outside any term). The
    work is not lost: the next leader's term does it."""

    default_reason = "TermEnded"


@dataclass
class Child:
    process: subprocess.Popen[str]
    args: list[str]
    keepalive: int  # the write end of the watchdog's pipe


class Term:
    """One span of authority over the stacks; see the module's docstring.

    `valid_until` (monotonic seconds, shared by every process on this host) bounds how long an operation
    may run without news from this process: infinite for a folder-mode term, a leader's renew deadline.
    `before_operation` runs before each operation starts (the leader's operations heartbeat, which must be
    on record before any lock is taken); it may raise to refuse the operation.
    """

    def __init__(
        self,
        name: str,
        *,
        valid_until: float = math.inf,
        before_operation: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._children: dict[int, Child] = {}
        self._ended = False
        self._valid_until = valid_until
        self._before = before_operation
        self._idle = threading.Condition(self._lock)
        self._close_listeners: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return f"Term({self.name}, ended={self._ended}, children={len(self._children)})"

    # --- state --------------------------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def valid_until(self) -> float:
        return self._valid_until

    def busy(self) -> bool:
        """Any child running (an operation or a read)?"""
        with self._lock:
            return bool(self._children)

    def extend(self, until: float) -> None:
        """The term is good until `until` (monotonic): told to every running child's watchdog."""
        with self._lock:
            if self._ended:
                return
            self._valid_until = until
            children = [child for child in self._children.values() if is_operation(child.args)]
        for child in children:
            _tell(child.keepalive, until)

    # --- the spawn point ----------------------------------------------------------------------------

    def check(self, args: list[str]) -> None:
        """Raise TermEndedError when this call may not start in this term."""
        if self._ended and is_operation(args):
            raise TermEndedError(f"term {self.name} has ended: `pulumi {_brief(args)}` was not started")
        if self._before is not None and is_operation(args):
            self._before()

    def spawn(self, start: Callable[[float], tuple[subprocess.Popen[str], int]], args: list[str]) -> Child:
        """Start a child through `start(valid_until) -> (process, keepalive fd)` under the term's lock, so
        `end()` cannot miss it; refused (TermEndedError) when the term ended meanwhile."""
        self.check(args)
        operation = is_operation(args)
        with self._lock:
            if self._ended and operation:
                raise TermEndedError(f"term {self.name} has ended: `pulumi {_brief(args)}` was not started")
            if operation and self._valid_until <= time.monotonic():
                raise TermEndedError(
                    f"term {self.name} is not renewed: `pulumi {_brief(args)}` was not started (it would "
                    "outlive what the term is sure of)"
                )
            # A read may run past the deadline (it writes nothing); it still dies with this process.
            process, keepalive = start(self._valid_until if operation else math.inf)
            child = Child(process=process, args=args, keepalive=keepalive)
            self._children[process.pid] = child
            return child

    def finished(self, child: Child) -> None:
        with self._lock:
            self._children.pop(child.process.pid, None)
            self._idle.notify_all()
        _close(child.keepalive)

    # --- the end --------------------------------------------------------------------------------------

    def close(self) -> None:
        """Refuse new operations from now on (cheap: call it first when a term must stop), here and in the
        engine hosts of the term (their close listeners)."""
        with self._lock:
            listeners = [] if self._ended else list(self._close_listeners)
            self._ended = True
        for listener in listeners:
            listener()

    def on_close(self, listener: Callable[[], None]) -> None:
        """Call `listener` when the term closes (at once when it has): an engine host's term closes too."""
        with self._lock:
            if not self._ended:
                self._close_listeners.append(listener)
                return
        listener()

    def end(self, *, grace: float = 10.0) -> int:
        """Close, SIGINT every running child, and wait until none is left; a child still running after
        `grace` seconds is killed. Returns how many children were running. Blocking."""
        self.close()
        with self._lock:
            children = list(self._children.values())
        for child in children:
            log.info(
                "term %s ends: SIGINT to pulumi %s (pid %d) so it cancels cleanly",
                self.name,
                _brief(child.args),
                child.process.pid,
            )
            _signal(child.process, signal.SIGINT)
        deadline = time.monotonic() + grace
        with self._lock:
            while self._children:
                left = deadline - time.monotonic()
                if left <= 0:
                    for child in self._children.values():
                        log.warning(
                            "term %s ends: pulumi (pid %d) outlived %g s of grace; killed",
                            self.name,
                            child.process.pid,
                            grace,
                        )
                        _signal(child.process, signal.SIGKILL)
                    deadline = math.inf  # killed: wait for their exit, which cannot take long
                    left = 1.0
                self._idle.wait(min(left, 1.0))
        return len(children)


def _tell(fd: int, until: float) -> None:
    with contextlib.suppress(OSError):  # the watchdog has exited: nothing to tell
        os.write(fd, f"{until!r}\n".encode())


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _signal(process: subprocess.Popen[str], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, OSError):
        process.send_signal(signum)


def _brief(args: list[str]) -> str:
    words = [arg for arg in args if not arg.startswith("-")]
    return " ".join(words[:3])
