"""Where a process's threads spend a window, sampled by py-spy (a benchmark aid: BENCH_PYSPY=<py-spy binary>).

py-spy (PyPI: `pip install py-spy`; not a dependency of the project) samples every thread's stack from
outside, idle frames included (`--idle`): a thread blocked in a system call shows that call, so an event
loop that waits on something other than its selector (a file, a lock, a synchronous client) is seen as
such, and the share in the loop's own wait (asyncio's selector, or uvloop's C code) is its idle time.
Printed per thread with most samples: the share of samples in that wait, then the functions most often on
the stack (inclusive) and at its top (where the time is spent). Root can sample any process; others need
ptrace rights.
"""

from __future__ import annotations

import collections
import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

# the top frame of a loop waiting for events: asyncio's selector, or uvloop's loop (its C code shows no
# frame of its own: idle there, or uvloop's own work such as reading sockets)
IDLE = (
    "select (selectors.py",
    "EpollSelector.select",
    "Runner.run (asyncio/runners.py",
    "run_until_complete",
)
WAITS = (*IDLE, ".wait (threading.py", "_worker (concurrent/futures/thread.py")  # a thread's own waits
TOP = 15


@contextlib.contextmanager
def sampled(binary: str, pid: int, out: Path, *, seconds: float, rate: int = 50) -> Iterator[None]:
    """Sample `pid` for `seconds` (py-spy stops on its own) while the block runs; print the summary."""
    command = [binary, "record", "--pid", str(pid), "--idle", "--threads", "--nonblocking"]
    command += ["--format", "raw", "--rate", str(rate), "-d", str(max(1, int(seconds))), "-o", str(out)]
    spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield
    finally:
        try:
            _, err = spy.communicate(timeout=seconds + 60)
        except subprocess.TimeoutExpired:
            spy.kill()
            _, err = spy.communicate()
        if out.exists():
            print(summary(out.read_text()))
        else:
            print(f"py-spy wrote nothing: {err.decode(errors='replace').strip()[-500:]}")


def summary(raw: str, threads: int = 2) -> str:
    """The busiest `threads` threads of py-spy's raw (collapsed) output: idle share, inclusive, self."""
    stacks: dict[str, list[tuple[list[str], int]]] = collections.defaultdict(list)
    for line in raw.splitlines():
        frames_text, _, count = line.rpartition(" ")
        if not frames_text or not count.isdigit():
            continue
        thread, *frames = frames_text.split(";")
        stacks[thread.split(": ", 1)[-1]].append((frames, int(count)))
    lines: list[str] = []
    # with --idle every thread has as many samples as the others: the event loop's thread first, then the
    # threads by their samples outside a wait (a loop's, a lock's or a work queue's)
    ranked = sorted(stacks.items(), key=lambda item: (not _runs_the_loop(item[1]), -_busy(item[1])))
    for thread, samples in ranked[:threads]:
        total = sum(n for _, n in samples)
        idle = sum(n for frames, n in samples if frames and any(frames[-1].startswith(i) for i in IDLE))
        inclusive: collections.Counter[str] = collections.Counter()
        own: collections.Counter[str] = collections.Counter()
        for frames, n in samples:
            for name in {frame.rsplit(":", 1)[0] + ")" for frame in frames}:  # by function, not by line
                inclusive[name] += n
            if frames:
                own[frames[-1]] += n
        waiting = f"{idle / total:.0%} in the loop's wait (idle)"
        lines.append(f"py-spy, thread {thread}: {total} samples, {waiting}")
        lines.append("  on the stack (inclusive):")
        lines += [f"    {n / total:6.1%}  {name}" for name, n in inclusive.most_common(TOP)]
        lines.append("  at the top of the stack (self):")
        lines += [f"    {n / total:6.1%}  {name}" for name, n in own.most_common(TOP)]
    return "\n".join(lines)


def _runs_the_loop(samples: list[tuple[list[str], int]]) -> bool:
    return any(
        frame.startswith(("Runner.run", "run_until_complete")) for frames, _ in samples for frame in frames
    )


def _busy(samples: list[tuple[list[str], int]]) -> int:
    return sum(n for frames, n in samples if frames and not any(w in frames[-1] for w in WAITS))
