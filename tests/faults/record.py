"""Every Pulumi CLI call of every replica, recorded by a wrapper, and the check that no two lock-taking calls
ran on one stack at once.

`install_wrapper(folder, log)` writes `folder/pulumi`, an executable Python script, beside symlinks to every
other file of the real CLI's folder (the engine puts the CLI's folder first on PATH to find the language
host and the plugins). The wrapper appends a start line to `log` (one `os.write` of one line on an O_APPEND
descriptor, so lines from concurrent calls never interleave), runs the real CLI as its child (which dies
with it: `prctl(PR_SET_PDEATHSIG, SIGKILL)`), forwards SIGINT/SIGTERM to it, and appends an end line with
its exit code. A call whose end line never comes (its wrapper was SIGKILLed) is closed by the `Monitor` at
the first moment its pid is seen gone.

The replica's identity comes from the inherited environment: the Automation API runs every CLI call with
`{**os.environ, **additional_env}` (pulumi/automation/_cmd.py), so `PROXY_OPERATOR_KUBE_IDENTITY` of the
`serve` process reaches the wrapper as it is.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WRAPPER = r"""#!{python}
import ctypes, json, os, signal, subprocess, sys, threading, time
REAL, LOG = {real!r}, {log!r}


def write(entry):
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(fd)


def stack_of(argv):
    for i, arg in enumerate(argv):
        if arg in ("--stack", "-s") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--stack="):
            return arg.split("=", 1)[1]
    return os.path.basename(os.getcwd())


def die_with_wrapper():
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


argv = sys.argv[1:]
write({{"event": "start", "time": time.time(), "pid": os.getpid(), "argv": argv, "cwd": os.getcwd(),
       "stack": stack_of(argv), "replica": os.environ.get("PROXY_OPERATOR_KUBE_IDENTITY"),
       "term": os.environ.get("PROXY_OPERATOR_TERM")}})
child = subprocess.Popen([REAL, *argv], preexec_fn=die_with_wrapper, stderr=subprocess.PIPE)
locked = []


def tee():  # stderr passed on as it comes; a refusal for a held lock is noted (it took no lock)
    for line in child.stderr:
        sys.stderr.buffer.write(line)
        sys.stderr.buffer.flush()
        if b"currently locked" in line:
            locked.append(True)


reader = threading.Thread(target=tee, daemon=True)
reader.start()
for number in (signal.SIGINT, signal.SIGTERM):
    signal.signal(number, lambda signum, _frame: child.send_signal(signum))
while True:
    try:
        rc = child.wait()
        break
    except InterruptedError:
        continue
reader.join(5)
refused = bool(locked) and rc != 0
write({{"event": "end", "time": time.time(), "pid": os.getpid(), "rc": rc, "locked_out": refused}})
sys.exit(rc if rc >= 0 else 128 - rc)
"""

# argv subcommands that take the stack's lock (`preview` does not, for this check; nor do the reads).
LOCK_TAKING = {"up", "update", "destroy", "refresh", "cancel"}
LOCK_TAKING_PAIRS = {("stack", "import")}
LOCK_TAKING_GROUPS = {"state"}


def install_wrapper(folder: Path, log: Path, real: Path, python: str) -> Path:
    """`folder/pulumi` recording into `log` and running `real`; symlinks to `real`'s siblings beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    real = real.resolve()
    for sibling in real.parent.iterdir():
        if sibling.name != "pulumi" and not (folder / sibling.name).exists():
            (folder / sibling.name).symlink_to(sibling.resolve())
    wrapper = folder / "pulumi"
    wrapper.write_text(WRAPPER.format(python=python, real=str(real), log=str(log)))
    wrapper.chmod(0o755)
    log.touch()
    return wrapper


# The CLI's global flags that take a value (`--color never up`): skipped with their value before the command.
GLOBAL_WITH_VALUE = {"--color", "--cwd", "-C", "--tracing", "--tracing-header", "-v", "--verbose",
                     "--profiling", "--memprofilerate", "--otel-traces"}  # fmt: skip


def subcommand(argv: list[str]) -> list[str]:
    """The CLI's command path: the words of argv after the leading global flags (the Automation API puts
    `--non-interactive` first) and before the first option: ["stack", "export"], ["up"]."""
    words: list[str] = []
    skip_value = False
    for arg in argv:
        if skip_value:
            skip_value = False
            continue
        if arg.startswith("-"):
            if words:
                break
            skip_value = arg in GLOBAL_WITH_VALUE  # `--color=never` carries its own value
            continue
        words.append(arg)
    return words


def lock_taking(argv: list[str]) -> bool:
    """`refresh --preview-only` is a preview (no lock taken, as for `preview`): not counted."""
    words = subcommand(argv)
    if not words:
        return False
    if words[0] == "refresh" and "--preview-only" in argv:
        return False
    return words[0] in LOCK_TAKING or words[0] in LOCK_TAKING_GROUPS or tuple(words[:2]) in LOCK_TAKING_PAIRS


@dataclass
class Call:
    """One CLI call: its start line, and its end (from the end line or the monitor)."""

    pid: int
    start: float
    argv: list[str]
    stack: str
    replica: str | None
    term: str | None
    cwd: str = ""
    end: float | None = None
    rc: int | None = None
    ended_by: str = ""  # "line" or "monitor" (no end line: the wrapper was killed)
    locked_out: bool = False  # failed on the stack's lock held by another call: it took no lock
    held_lock: bool | None = None  # seen holding its stack's lock file (None: no lock sampling)
    held: tuple[float, float] | None = None  # when its lock file was first and last seen (sampled)

    @property
    def command(self) -> str:
        return " ".join(subcommand(self.argv))

    def line(self) -> str:
        end = f"{self.end:.3f}" if self.end is not None else "running"
        return (
            f"{self.replica} pid {self.pid} `pulumi {' '.join(self.argv[:6])}` on {self.stack} "
            f"[{self.start:.3f}, {end}] rc {self.rc} term {self.term} (end: {self.ended_by or '-'})"
        )


def parse(
    lines: Iterable[str],
    closed: dict[tuple[int, float], float] | None = None,
    holders: dict[int, tuple[float, float]] | None = None,
) -> list[Call]:
    """The calls of a log's lines; `closed` ((pid, start) -> time) ends the calls the monitor saw die
    without an end line; `holders`: the wrapper pids seen holding a lock file (None: not sampled)."""
    calls: list[Call] = []
    open_by_pid: dict[int, Call] = {}
    for text in lines:
        try:
            entry: dict[str, Any] = json.loads(text)
        except ValueError:
            continue
        pid = int(entry.get("pid", 0))
        if entry.get("event") == "start":  # a stack `org/project/name` or `name`: compared by name
            call = Call(pid=pid, start=float(entry["time"]), argv=list(entry.get("argv") or []),
                        stack=str(entry.get("stack") or "").rsplit("/", 1)[-1], replica=entry.get("replica"),
                        term=entry.get("term"), cwd=str(entry.get("cwd") or ""))  # fmt: skip
            calls.append(call)
            open_by_pid[pid] = call
        elif entry.get("event") == "end" and pid in open_by_pid:
            call = open_by_pid.pop(pid)
            call.end, call.rc, call.ended_by = float(entry["time"]), entry.get("rc"), "line"
            call.locked_out = bool(entry.get("locked_out"))
    for pid, call in open_by_pid.items():
        if closed and (pid, call.start) in closed:
            call.end, call.ended_by = closed[(pid, call.start)], "monitor"
    if holders is not None:
        for call in calls:
            call.held_lock = call.pid in holders
            call.held = holders.get(call.pid)
    return calls


@dataclass(frozen=True)
class Overlap:
    first: Call
    second: Call

    def describe(self) -> str:
        return f"stack {self.first.stack}: {self.first.line()} overlaps {self.second.line()}"


def overlaps(calls: list[Call], *, now: float | None = None) -> list[Overlap]:
    """Pairs of lock-taking calls on one stack whose [start, end] intersect (a running call ends `now`).

    With lock sampling, an `up`/`destroy`/`refresh`/... counts only if it was seen holding its stack's lock
    (an `up` of a new leader may start while a frozen one runs and be refused at the lock, or a frozen one
    that never took the lock may be interrupted after the new one ran: neither wrote); a `cancel` always
    counts (it removes the lock of whatever holds it)."""
    now = time.time() if now is None else now
    by_stack: dict[str, list[Call]] = {}
    for call in calls:
        if not lock_taking(call.argv) or call.locked_out:  # refused at the lock: it never held it
            continue
        if call.held_lock is False and subcommand(call.argv)[:1] != ["cancel"]:
            continue
        by_stack.setdefault(call.stack, []).append(call)
    found = []
    for stack_calls in by_stack.values():
        stack_calls.sort(key=lambda c: c.start)
        for i, first in enumerate(stack_calls):
            for second in stack_calls[i + 1 :]:
                if _span(second, now)[0] > _span(first, now)[1] + SAMPLE:
                    continue
                a, b = _span(first, now), _span(second, now)
                if a[0] <= b[1] + SAMPLE and b[0] <= a[1] + SAMPLE:
                    found.append(Overlap(first, second))
    return found


SAMPLE = 0.1  # the lock files are sampled every 50 ms: held spans are widened by this much


def _span(call: Call, now: float) -> tuple[float, float]:
    """When the call held its stack: the sampled span of its lock file when known (the CLI releases the
    lock before it exits: an `up` ending while the next one has taken the lock is no overlap), else its
    whole life."""
    if call.held is not None:
        return call.held
    return call.start, call.end if call.end is not None else now


def lock_pids(locks: Path) -> set[int]:
    """The pids recorded in the lock files of a self-managed backend (`.pulumi/locks/**/<id>.json`)."""
    found = set()
    for lock in locks.rglob("*.json") if locks.exists() else ():
        try:
            found.add(int(json.loads(lock.read_text())["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or just released
    return found


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def pid_alive(pid: int) -> bool:
    """The process exists and is no zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


class Record:
    """The shared log plus the monitor's closings; `calls()` parses it afresh."""

    def __init__(self, log: Path, locks: Path | None = None) -> None:
        self.log = log
        self.locks = locks  # the backend's `.pulumi/locks` folder, sampled every 50 ms (None: not sampled)
        self.holders: dict[int, tuple[float, float]] = {}  # wrapper pid -> its lock file first/last seen
        self.closed: dict[tuple[int, float], float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._monitor, name="pulumi-record-monitor", daemon=True)

    def calls(self) -> list[Call]:
        with self._lock:
            closed = dict(self.closed)
            holders = dict(self.holders) if self.locks is not None else None
        return parse(self.log.read_text(errors="replace").splitlines(), closed, holders)

    def running(self, command: str | None = None, replica: str | None = None) -> list[Call]:
        return [
            c
            for c in self.calls()
            if c.end is None
            and (command is None or subcommand(c.argv)[: len(command.split())] == command.split())
            and (replica is None or c.replica == replica)
        ]

    def start(self) -> None:
        self._thread.start()

    def _sample_locks(self) -> None:
        """The CLI holding a lock is the wrapper's child: its parent is the recorded pid."""
        if self.locks is None:
            return
        seen = time.time()
        for pid in lock_pids(self.locks):
            parent = parent_of(pid)
            if parent is not None:
                with self._lock:
                    first, _ = self.holders.get(parent, (seen, seen))
                    self.holders[parent] = (first, seen)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _monitor(self) -> None:
        """Every 50 ms: a started call without an end line whose pid is gone ends now."""
        while not self._stop.wait(0.05):
            self._sample_locks()
            gone = {(c.pid, c.start) for c in self.calls() if c.end is None and not pid_alive(c.pid)}
            if not gone:
                continue
            seen = time.time()
            still_open = {(c.pid, c.start) for c in self.calls() if c.end is None}  # end lines may have come
            with self._lock:
                for key in gone & still_open:
                    self.closed.setdefault(key, seen)
