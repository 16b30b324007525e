"""The fence at the one spawn point (automation/engine/term.py, command.py, watchdog.py).

Real processes throughout: the watchdog over a stand-in CLI (a Python script that records the signal it
gets), and the real Pulumi engine for the term's refusals and its end during an `up`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from automation.engine import Engine, EngineConfig, Term, TermEndedError
from automation.engine.command import WATCHDOG
from automation.engine.term import is_operation
from tests.automation.eventually import eventually
from tests.automation.fleet import Fleet
from tests.automation.test_shutdown_engine import pulumi_descendants, running_up
from tests.conftest import PulumiEnv
from tests.ports import free_port

CLI = textwrap.dedent(
    """
    import os, signal, sys, time
    marker = sys.argv[1]
    def interrupted(signum, frame):
        open(marker + ".tmp", "w").write("SIGINT")
        os.rename(marker + ".tmp", marker)  # whole or not at all: the test reads it as soon as it exists
        sys.exit(130)
    signal.signal(signal.SIGINT, interrupted)
    open(marker + ".started", "w").write("")
    time.sleep(120)
    """
)


def stand_in_cli(tmp_path: Path) -> list[str]:
    script = tmp_path / "cli.py"
    script.write_text(CLI)
    return [sys.executable, str(script), str(tmp_path / "marker")]


def watchdog(fd: int, valid_until: float, command: list[str]) -> list[str]:
    return [sys.executable, "-S", "-E", str(WATCHDOG), str(fd), repr(valid_until), "2.0", "--", *command]


def until_file(path: Path, within: float = 10.0) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def test_the_cli_is_interrupted_when_the_service_is_killed(tmp_path: Path) -> None:
    """SIGKILL of the service (it cannot clean up) closes the pipe: the watchdog interrupts the CLI."""
    cli = stand_in_cli(tmp_path)
    service = textwrap.dedent(
        f"""
        import os, subprocess, time
        read, write = os.pipe()
        command = [{sys.executable!r}, "-S", "-E", {str(WATCHDOG)!r}, str(read), "inf", "2.0", "--", *{cli!r}]
        subprocess.Popen(command, pass_fds=(read,))
        os.close(read)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", service])
    try:
        until_file(tmp_path / "marker.started")
        parent.kill()
        parent.wait()
        assert until_file(tmp_path / "marker") == "SIGINT", "the CLI outlived the service that started it"
    finally:
        parent.kill()


def test_the_cli_is_interrupted_when_its_term_is_not_renewed(tmp_path: Path) -> None:
    """A frozen service (SIGSTOP, a stuck node) stops extending the deadline: the CLI is interrupted at it;
    while it is extended, the CLI runs on."""
    read, write = os.pipe()
    start = time.monotonic()
    child = subprocess.Popen(watchdog(read, start + 1.0, stand_in_cli(tmp_path)), pass_fds=(read,))
    os.close(read)
    try:
        until_file(tmp_path / "marker.started")
        for _ in range(10):  # renewed for 2 s, past the first deadline
            os.write(write, f"{time.monotonic() + 1.0!r}\n".encode())
            time.sleep(0.2)
        assert child.poll() is None, "interrupted although its term was renewed"
        assert not (tmp_path / "marker").exists()
        assert until_file(tmp_path / "marker") == "SIGINT"  # no renewal any more
        assert child.wait(10) == 130
        assert time.monotonic() - start >= 2.0
    finally:
        os.close(write)
        child.kill()


COUNTING_CLI = textwrap.dedent(
    """
    import os, signal, sys, time
    marker = sys.argv[1]
    got = []
    def note(signum, frame):  # a CLI cancelling cleanly: it takes its time, counting what else comes
        got.append(signal.Signals(signum).name)
    signal.signal(signal.SIGINT, note)
    signal.signal(signal.SIGTERM, note)
    open(marker + ".started", "w").write("")
    while not got:
        time.sleep(0.05)
    time.sleep(1.5)
    open(marker + ".tmp", "w").write(" ".join(got))
    os.rename(marker + ".tmp", marker)
    sys.exit(130)
    """
)


def test_a_thawed_watchdog_interrupts_the_cli_once(tmp_path: Path) -> None:
    """A replica thawed after SIGSTOP: its watchdog finds the deadline passed while the service ends the
    term (SIGINT) and is stopped (SIGTERM). The CLI gets one SIGINT: a second ^C makes `pulumi` terminate
    at once, without the clean cancel that releases its stack lock (the faults campaign's lock left by a
    thawed leader's `up`)."""
    script = tmp_path / "cli.py"
    script.write_text(COUNTING_CLI)
    read, write = os.pipe()
    command = watchdog(read, time.monotonic() + 0.5, [sys.executable, str(script), str(tmp_path / "marker")])
    child = subprocess.Popen(command, pass_fds=(read,))
    os.close(read)
    try:
        until_file(tmp_path / "marker.started")
        time.sleep(0.7)  # the deadline has passed: the watchdog interrupted
        child.send_signal(signal.SIGINT)
        child.send_signal(signal.SIGTERM)
        assert until_file(tmp_path / "marker") == "SIGINT"
        assert child.wait(10) == 130
    finally:
        os.close(write)
        child.kill()


def test_reads_are_not_operations() -> None:
    assert not is_operation(["--non-interactive", "stack", "ls", "--json"])
    assert not is_operation(["stack", "output", "--json", "--stack", "s"])
    assert not is_operation(["stack", "export", "--stack", "s"])
    assert not is_operation(["stack", "tag", "ls", "--stack", "s"])
    assert not is_operation(["stack", "select", "--stack", "s"])
    for operation in (
        ["up", "--yes", "--stack", "s"],
        ["destroy", "--yes"],
        ["refresh", "--yes"],
        ["cancel", "--yes"],
        ["stack", "import", "--file", "f"],
        ["stack", "init", "s"],
        ["stack", "rm", "--yes"],
        ["stack", "tag", "set", "k", "v"],
        ["state", "delete", "urn"],
    ):
        assert is_operation(operation), operation


@pytest.mark.engine
def test_a_fenced_engine_reads_anywhere_but_operates_only_inside_a_live_term(pulumi_env: PulumiEnv) -> None:
    config = EngineConfig(
        backend_url=pulumi_env.backend_url,
        state_dir=pulumi_env.backend_dir.parent / "state",
        passphrase="test",
        fenced=True,
    )
    engine = Engine(config)
    assert engine.list_stack_names() == []  # a read: a follower may
    with pytest.raises(TermEndedError, match="no leadership term"):
        engine._command.run(["stack", "init", "s"], str(pulumi_env.backend_dir), {})
    term = Term("leader/1")
    bound = engine.in_term(term)
    assert engine.term is None  # a view: the shared engine is not bound
    term.close()
    with pytest.raises(TermEndedError, match="term leader/1 has ended"):
        bound._command.run(["stack", "init", "s"], str(pulumi_env.backend_dir), {})
    assert bound.list_stack_names() == []  # reads still run in an ended term


@pytest.mark.engine
def test_ending_a_term_during_an_up_interrupts_it_and_refuses_every_later_call(
    fleet: Fleet, pulumi_env: PulumiEnv
) -> None:
    """The review's race: step-down scanned /proc once, and a CLI call the `up` made after the scan ran to
    its end after the term was over. Now every call after end() began is refused at the spawn point, and
    end() returns only once no child is left."""
    for name in ("f1", "f2"):
        fleet.write_proxy(name, port=free_port())
    locks = pulumi_env.backend_dir / ".pulumi" / "locks"
    spawns: list[tuple[float, bool]] = []  # operations only (reads run in any term): (when, refused)
    ended_at: list[float] = []

    class RecordingTerm(Term):
        def spawn(self, start, args):  # type: ignore[no-untyped-def]
            operation = is_operation(args)
            try:
                child = super().spawn(start, args)
            except TermEndedError:
                spawns.append((time.monotonic(), True))
                raise
            if operation:
                spawns.append((time.monotonic(), False))
            return child

        def close(self) -> None:
            super().close()
            ended_at.append(time.monotonic())

    term = RecordingTerm("leader/7")

    async def scenario() -> None:
        controller = fleet.controller()
        controller.term = term
        controller.engine = controller.engine.in_term(term)
        controller.reconciler.engine = controller.engine
        fleet._controllers.append(controller)
        await controller.start()
        await eventually(lambda: running_up(locks), within=120, what="`pulumi up` holding the stack's lock")
        await asyncio.to_thread(term.end, grace=60)
        assert pulumi_descendants(os.getpid()) == [], "a pulumi child outlived its term"
        with pytest.raises(TermEndedError):
            await asyncio.to_thread(controller.engine.destroy, "local")
        await asyncio.sleep(1.0)  # the worker's next CLI call, if any, comes now: it must be refused
        await controller.queue.drain()

    asyncio.run(fleet.run(scenario))
    accepted_after = [when for when, refused in spawns if not refused and when > ended_at[0]]
    assert accepted_after == [], f"{len(accepted_after)} operation(s) started after the term ended"
    assert any(refused for _, refused in spawns), "nothing was refused: the fence was not exercised"
