"""`automation.parent_watch`: a plugin (the language host, the dynamic provider) dies with the process that
started it, even when that parent is SIGKILLed, and lives as long as the parent does. Real processes: a
parent that starts a watching child, then is killed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

CHILD = """
import os, sys, time
if sys.argv[1] == "poll":
    del os.pidfd_open  # Linux before 5.3: the polling fallback
from automation.parent_watch import exit_with_parent
exit_with_parent()
print("watching", flush=True)
time.sleep(600)
"""

PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == "watching\\n"
print(child.pid, flush=True)
time.sleep(600)
"""


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def start_family(mode: str) -> tuple[subprocess.Popen[str], int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, mode], stdout=subprocess.PIPE, text=True, env=env
    )
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


@pytest.mark.parametrize("mode", ["pidfd", "poll"])
def test_the_child_dies_with_its_sigkilled_parent_and_lives_while_it_lives(mode: str) -> None:
    parent, child = start_family(mode)
    try:
        time.sleep(1.2)  # more than two of the fallback's polls
        assert running(child), "the child ended while its parent still ran"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(child), "the child outlived its SIGKILLed parent"
    finally:
        for pid in (parent.pid, child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        parent.wait()
        assert parent.stdout is not None
        parent.stdout.close()


def test_a_child_whose_parent_is_already_gone_dies_at_once() -> None:
    """Reparented before the watch began (the parent died between fork and the plugin's start)."""
    code = "import os, sys; os.getppid = lambda: 1\nfrom automation.parent_watch import exit_with_parent\n"
    code += "exit_with_parent(); print('survived')"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == -signal.SIGKILL
    assert "survived" not in done.stdout
