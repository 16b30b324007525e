"""The watchdog every `pulumi` child runs under: the CLI dies with its term, and with the service.

    python -S -E watchdog.py FD VALID_UNTIL GRACE -- /path/to/pulumi ARGS...

Runs the CLI as its own child (stdin, stdout and stderr passed straight through, so the Automation API
reads the CLI's output as before) and holds FD, the read end of a pipe whose write end only the service
holds. The CLI is interrupted (SIGINT: it cancels cleanly, writes its checkpoint and releases the stack
lock; SIGKILL after GRACE seconds) when:

- the pipe closes: the service exited or was killed, even by SIGKILL (a process cannot miss that);
- VALID_UNTIL passes (CLOCK_MONOTONIC seconds, the same clock on every process of the host) without the
  service writing a later one on the pipe (one number a line): the service is frozen (SIGSTOP, a stuck
  node) or its term could not be renewed, so another replica may soon take over the stack.

SIGINT and SIGTERM sent to the watchdog are passed on to the CLI as one SIGINT, once: the CLI takes a second
^C as "terminate immediately" (no clean cancel), and a term's end and a missed deadline can both come at
once (a frozen replica thawed). What the CLI does not finish in GRACE seconds is killed, by the watchdog
or by the service. The CLI gets PR_SET_PDEATHSIG(SIGKILL),
so killing the watchdog kills it too. The exit status is the CLI's. This file imports nothing of the
project (it starts with `-S -E`: 45 ms per call measured beside a CI run) and is started only by
`automation.engine.command`.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the CLI's process, between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def main(argv: list[str]) -> int:
    fd, valid_until, grace = int(argv[1]), float(argv[2]), float(argv[3])
    command = argv[argv.index("--") + 1 :]
    child = subprocess.Popen(command, preexec_fn=_die_with_parent, close_fds=True)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda _s, _f: _interrupt_once(child))
    pidfd = os.pidfd_open(child.pid)
    buffered = b""
    why = ""
    while not why:
        timeout = None if math.isinf(valid_until) else max(0.0, valid_until - time.monotonic())
        try:
            ready, _, _ = select.select([pidfd, fd], [], [], timeout)
        except InterruptedError:
            continue
        if pidfd in ready:
            return _exit_status(child.wait())
        if fd in ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                why = "the service that started it is gone"
                break
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                if line.strip():
                    valid_until = float(line)
        elif not math.isinf(valid_until) and time.monotonic() >= valid_until:
            why = "its term was not renewed in time"
    return _interrupt(child, why=why, grace=grace)


def _interrupt(child: subprocess.Popen[bytes], *, why: str, grace: float) -> int:
    sys.stderr.write(f"proxy-operator watchdog: interrupting pulumi (pid {child.pid}): {why}\n")
    sys.stderr.flush()
    _interrupt_once(child)
    try:
        return _exit_status(child.wait(grace))
    except subprocess.TimeoutExpired:
        sys.stderr.write(f"proxy-operator watchdog: pulumi (pid {child.pid}) outlived {grace:g} s: killed\n")
        child.kill()
        return _exit_status(child.wait())


_interrupted = False


def _interrupt_once(child: subprocess.Popen[bytes]) -> None:
    global _interrupted
    if not _interrupted:
        _interrupted = True
        _send(child, signal.SIGINT)


def _send(child: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(signum)


def _exit_status(code: int) -> int:
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
