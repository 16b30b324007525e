"""The forward proxy's process runs on uvloop where it is installed (it is here: uvicorn's loop), on
asyncio's loop when PROXY_OPERATOR_PROXY_LOOP=asyncio asks, and relays the same either way; a process the
`local` provider starts runs under SCHED_BATCH (it does not preempt the service that wakes it), any other
as it comes, and at the priority of the service where an engine host's lowered one was inherited."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from stacks.forward_proxy.loop import LOOP_ENV, SCHED_ENV, loop_factory
from stacks.programs import local_process
from tests.ports import free_port
from tests.security.loopback_site import serve_page

ROOT = Path(__file__).resolve().parents[2]


def _uvloop_loaded(pid: int) -> bool:
    """Whether the process mapped uvloop's extension (its event loop)."""
    return "uvloop/loop." in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("asked", ["uvloop", "asyncio"])
def test_the_proxy_process_runs_on_the_loop_asked_for_and_relays(tmp_path: Path, asked: str) -> None:
    """Started by hand (as in a pod or a VM), without SCHED_ENV: the normal scheduling policy."""
    port = free_port()
    config = tmp_path / "proxy.json"
    egress = {"allow": [{"cidr": "127.0.0.1/32"}]}
    config.write_text(json.dumps({"bind": "127.0.0.1", "port": port, "protocol": "http", "egress": egress}))
    env = {**os.environ, LOOP_ENV: asked}
    proxy = subprocess.Popen([sys.executable, "-m", "stacks.forward_proxy", str(config)], env=env)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proxy.poll() is None, "the proxy exited"
                assert time.monotonic() < deadline, "the proxy did not listen"
                time.sleep(0.05)
        assert _uvloop_loaded(proxy.pid) is (asked == "uvloop")
        assert SCHED_ENV not in env
        assert os.sched_getscheduler(proxy.pid) == os.SCHED_OTHER
        with (
            serve_page(b"relayed") as site,
            httpx.Client(proxy=f"http://127.0.0.1:{port}", timeout=10) as client,
        ):
            answer = client.get(f"http://127.0.0.1:{site}/")
        assert (answer.status_code, answer.content) == (200, b"relayed")
    finally:
        proxy.terminate()
        proxy.wait(10)


def test_the_loop_factory_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvloop

    monkeypatch.delenv(LOOP_ENV, raising=False)
    assert loop_factory() is uvloop.new_event_loop
    monkeypatch.setenv(LOOP_ENV, "asyncio")
    assert loop_factory() is None


def test_a_process_the_local_provider_starts_runs_under_sched_batch(tmp_path: Path) -> None:
    """The shared listener as the `local` provider starts it (its environment, posix_spawn), for real."""
    control = str(tmp_path / "control.sock")
    ref = local_process.spawn(local_process.shared_command(control), log_path=tmp_path / "listener.log")
    try:
        deadline = time.monotonic() + 20
        while not Path(control).exists():  # listening: past `schedule()`, which runs first
            assert local_process.is_running(ref), (tmp_path / "listener.log").read_text()
            assert time.monotonic() < deadline, "the listener did not start"
            time.sleep(0.05)
        assert os.sched_getscheduler(ref.pid) == os.SCHED_BATCH
        assert "refused" not in (tmp_path / "listener.log").read_text()
    finally:
        local_process.stop(ref, grace=2)


SPAWN_NICER = """
import os, sys
from pathlib import Path
from stacks.programs import local_process
if sys.argv[2] == "nobody":
    os.setgroups([]); os.setgid(65534); os.setuid(65534)  # no CAP_SYS_NICE: a lowered nice stays
own = os.nice(0)
os.nice(5)  # as the engine host does (automation/engine/host.py)
os.environ[local_process.NICE_ENV] = str(own)
ref = local_process.spawn(["/bin/sleep", "30"], log_path=Path(sys.argv[1]))
print(ref.pid, own, flush=True)
"""


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_a_proxy_started_under_a_lowered_priority_goes_back_to_the_one_it_was_lowered_from(user: str) -> None:
    """An engine host lowers its priority (`engine_host_nice`) and the `local` proxies its `up` starts would
    inherit it: they carry crawler traffic, so they go back to the service's where allowed (root: here),
    and keep it with a line in their log saying why where not (`nobody`: no CAP_SYS_NICE)."""
    if os.geteuid() != 0:
        pytest.fail("needs root: the test takes CAP_SYS_NICE away by becoming nobody")
    with tempfile.TemporaryDirectory(prefix="nice-") as folder:  # tmp_path's parents: root's alone
        Path(folder).chmod(0o777)  # nobody writes the log
        log = Path(folder) / "proxy.log"
        out = subprocess.run(
            [sys.executable, "-c", SPAWN_NICER, str(log), user],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert out.returncode == 0, out.stderr
        pid, own = (int(x) for x in out.stdout.split())
        try:
            if user == "root":
                assert os.getpriority(os.PRIO_PROCESS, pid) == own
                assert "refused" not in log.read_text()
            else:
                assert os.getpriority(os.PRIO_PROCESS, pid) == own + 5
                assert f"lowered priority: setting nice {own} was refused" in log.read_text()
        finally:
            os.kill(pid, signal.SIGKILL)
