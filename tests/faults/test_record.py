"""The recording wrapper and the overlap checker, on a stand-in CLI (no engine needed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.faults.record import (
    Call,
    Record,
    install_wrapper,
    lock_taking,
    overlaps,
    parse,
    pid_alive,
    subcommand,
)


def call(
    pid: int, start: float, end: float | None, argv: str, stack: str = "local-a", replica: str = "r1"
) -> Call:
    return Call(pid=pid, start=start, end=end, argv=argv.split(), stack=stack, replica=replica, term=None)


def test_lock_taking_commands() -> None:
    for argv in ("up --yes --stack s", "destroy --yes", "refresh", "cancel --yes", "stack import --file f",
                 "state delete urn", "update"):  # fmt: skip
        assert lock_taking(argv.split()), argv
        # as the Automation API calls it: global flags first
        assert lock_taking(["--non-interactive", *argv.split()]), argv
        assert lock_taking(["--color", "never", "--non-interactive", *argv.split()]), argv
    reads = ("preview", "stack export --stack s", "stack output", "stack ls", "stack tag ls", "stack select",
             "config set a b", "version", "", "refresh --preview-only --exec-kind auto.local")  # fmt: skip
    for argv in reads:
        assert not lock_taking(argv.split()), argv
        assert not lock_taking(["--non-interactive", *argv.split()]), argv


def test_the_command_path_follows_the_global_flags() -> None:
    argv = ["--non-interactive", "up", "--yes", "--skip-preview", "--parallel", "16", "--stack", "local-a"]
    assert subcommand(argv) == ["up"]
    assert subcommand(["--non-interactive", "stack", "output", "--json"]) == ["stack", "output"]
    assert subcommand(["--cwd", "/x", "--non-interactive", "stack", "select", "--stack", "s"]) == [
        "stack",
        "select",
    ]


def test_overlapping_lock_taking_calls_on_one_stack_are_flagged() -> None:
    up = call(10, 100.0, 110.0, "up --yes", replica="r1")
    cancel = call(20, 105.0, 106.0, "cancel --yes", replica="r2")  # cancels r1's running up: counts
    found = overlaps([up, cancel], now=200.0)
    assert [(o.first.pid, o.second.pid) for o in found] == [(10, 20)]
    assert "overlaps" in found[0].describe()
    assert "r2" in found[0].describe()


def test_a_call_refused_at_the_lock_took_no_lock() -> None:
    """A new leader's `up` that fails on the lock the frozen one holds never held it: no overlap; one that
    held it (not refused) is one."""
    frozen = call(10, 100.0, 130.0, "up --yes", replica="r1")
    refused = call(20, 110.0, 111.0, "up --yes", replica="r2")
    refused.locked_out = True
    assert overlaps([frozen, refused], now=200.0) == []
    refused.locked_out = False
    assert len(overlaps([frozen, refused], now=200.0)) == 1


def test_with_lock_sampling_only_holders_and_cancels_count() -> None:
    """A frozen `up` that never took the lock (interrupted after the new leader's ran) wrote nothing; a
    cancel while another holds the lock always counts."""
    frozen = call(10, 100.0, 130.0, "up --yes", replica="r1")
    holder = call(20, 110.0, 120.0, "up --yes", replica="r2")
    frozen.held_lock, holder.held_lock = False, True
    assert overlaps([frozen, holder], now=200.0) == []
    frozen.held_lock = True
    assert len(overlaps([frozen, holder], now=200.0)) == 1
    cancel = call(30, 105.0, 105.5, "cancel --yes", replica="r2")
    cancel.held_lock = False
    assert len(overlaps([frozen, cancel], now=200.0)) == 1


def test_a_call_still_running_overlaps_a_later_one() -> None:
    killed = call(10, 100.0, None, "up --yes")
    later = call(20, 150.0, 160.0, "refresh --yes")
    assert len(overlaps([killed, later], now=200.0)) == 1


def test_no_overlap_when_disjoint_or_other_stack_or_a_read() -> None:
    calls = [
        call(1, 100.0, 110.0, "up --yes"),
        call(2, 110.5, 120.0, "destroy --yes"),
        call(3, 101.0, 109.0, "up --yes", stack="local-b"),
        call(4, 102.0, 103.0, "preview"),
        call(5, 102.0, 103.0, "stack export --stack local-a"),
    ]
    assert overlaps(calls, now=200.0) == []


def test_parse_pairs_start_and_end_lines_and_the_monitor_closes_silent_ones() -> None:
    lines = [
        json.dumps({"event": "start", "time": 1.0, "pid": 7, "argv": ["up"], "stack": "s", "replica": "r"}),
        json.dumps({"event": "start", "time": 2.0, "pid": 8, "argv": ["up"], "stack": "s", "replica": "q"}),
        json.dumps({"event": "end", "time": 3.0, "pid": 7, "rc": 0}),
        "not json",
    ]
    first, second = parse(lines, closed={(8, 2.0): 5.0})
    assert (first.end, first.rc, first.ended_by) == (3.0, 0, "line")
    assert (second.end, second.ended_by) == (5.0, "monitor")
    assert len(overlaps([first, second])) == 1


def fake_cli(folder: Path) -> Path:
    """A stand-in `pulumi` that sleeps as long as its last argument says, with a plugin beside it."""
    folder.mkdir()
    cli = folder / "pulumi"
    cli.write_text(f"#!{sys.executable}\nimport sys, time\ntime.sleep(float(sys.argv[-1]))\nsys.exit(3)\n")
    cli.chmod(0o755)
    (folder / "pulumi-language-python").write_text("plugin")
    return cli


def test_the_wrapper_records_two_concurrent_ups_as_an_overlap(tmp_path: Path) -> None:
    real = fake_cli(tmp_path / "real")
    log = tmp_path / "calls.jsonl"
    wrapper = install_wrapper(tmp_path / "wrap", log, real, sys.executable)
    assert (tmp_path / "wrap" / "pulumi-language-python").is_symlink()
    env = {**os.environ, "PROXY_OPERATOR_KUBE_IDENTITY": "replica-x"}
    first = subprocess.Popen([str(wrapper), "up", "--stack", "local-a", "0.8"], env=env)
    time.sleep(0.3)
    second = subprocess.Popen([str(wrapper), "up", "--stack", "local-a", "0.2"], env=env)
    assert (first.wait(10), second.wait(10)) == (3, 3)
    calls = Record(log).calls()
    assert [c.replica for c in calls] == ["replica-x", "replica-x"]
    assert all(c.stack == "local-a" and c.rc == 3 for c in calls)
    assert len(overlaps(calls)) == 1


def test_a_killed_wrapper_takes_its_cli_along_and_the_monitor_ends_the_call(tmp_path: Path) -> None:
    real = fake_cli(tmp_path / "real")
    log = tmp_path / "calls.jsonl"
    wrapper = install_wrapper(tmp_path / "wrap", log, real, sys.executable)
    record = Record(log)
    record.start()
    process: subprocess.Popen[bytes] | None = None
    try:
        process = subprocess.Popen([str(wrapper), "destroy", "30"], cwd=tmp_path)
        deadline = time.monotonic() + 10
        while not record.running("destroy") and time.monotonic() < deadline:
            time.sleep(0.05)
        # the wrapper writes its start line before it starts the real CLI: wait for the child too
        children_file = Path(f"/proc/{process.pid}/task/{process.pid}/children")
        children = children_file.read_text().split()
        while not children and time.monotonic() < deadline:
            time.sleep(0.05)
            children = children_file.read_text().split()
        assert len(children) == 1
        process.send_signal(signal.SIGKILL)
        process.wait(5)
        deadline = time.monotonic() + 5
        while record.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        (killed,) = record.calls()
        assert killed.ended_by == "monitor"
        assert killed.stack == tmp_path.name
        deadline = time.monotonic() + 5
        while pid_alive(int(children[0])) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(int(children[0])), "the real CLI outlived its wrapper"
    finally:
        if process is not None and process.poll() is None:  # failed before the kill: leave no wrapper running
            process.kill()
            process.wait(5)
        record.stop()
