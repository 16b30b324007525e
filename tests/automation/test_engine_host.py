"""The engine host (automation/engine/host.py, hosted.py): a term's Pulumi calls in a child process of the
term, with the term's fence carried over. Real processes throughout: the real engine and CLI, `local`
proxies, the host started by the code under test, and a service stand-in process killed by SIGKILL."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from automation.engine import Engine, StackInput, Term, TermEndedError
from automation.engine.hosted import EngineHost, HostExitedError
from automation.errors import InvalidInputError
from automation.planner import Planner
from automation.stack_input import resolve_stack
from stacks.models import ProviderCatalogue, Proxy
from tests.automation.eventually import wait_until
from tests.automation.fleet import Fleet, accepts, proxy_doc
from tests.automation.test_shutdown_engine import children, pulumi_descendants, running_up
from tests.conftest import TOOLS_BIN, PulumiEnv
from tests.ports import free_port

pytestmark = pytest.mark.engine


class _NoSecrets:
    def read(self, *_args: object) -> None:  # pragma: no cover - no Proxy here names a Secret
        raise AssertionError("no secret is read")


def spec(fleet: Fleet, *ports: int) -> StackInput:
    planner = Planner()
    entry = {"name": "local", "type": "local", "stateDir": str(fleet.local_state / "local")}
    planner.set_catalogue(ProviderCatalogue.model_validate({"providers": [entry]}))
    for number, port in enumerate(ports):
        planner.upsert(Proxy.model_validate(proxy_doc(f"p{number}", port=port)))
    return resolve_stack(planner.plan("local"), credentials=_NoSecrets()).input  # type: ignore[arg-type]


def hosted_engine(fleet: Fleet, *, idle: float = 30.0, **changes: object) -> Engine:
    config = dataclasses.replace(fleet.settings().engine_config(), fenced=True, host_idle_seconds=idle)
    return Engine(dataclasses.replace(config, **changes))  # type: ignore[arg-type]


def up_in_background(engine: Engine, stack: StackInput) -> tuple[threading.Thread, list[BaseException]]:
    """`engine.up(stack)` in a started thread; what it raised lands in the list."""
    failure: list[BaseException] = []

    def up() -> None:
        try:
            engine.up(stack)
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=up)
    worker.start()
    return worker, failure


def host_of(engine: Engine) -> EngineHost:
    assert engine._host is not None
    return engine._host


def host_pids(term_pid: int = 0) -> list[int]:
    """Engine hosts below this process."""
    found = []
    for child in children(term_pid or os.getpid()):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"automation.engine.host" in cmdline:
            found.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def test_a_term_runs_its_calls_in_a_host_that_exits_when_idle(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    port = free_port()
    term = Term("leader/1")
    engine = hosted_engine(fleet, idle=1.0).in_term(term)
    result = engine.up(spec(fleet, port))
    host_records = [r for r in caplog.records if r.name == "automation.engine.events"]
    assert host_records, "the host's log records did not reach the service's logging"
    stacks = {getattr(record, "fields", {}).get("stack") for record in host_records}
    assert "local" in stacks, "their fields were lost"
    assert result.kind == "up"
    assert accepts(port)
    assert engine.list_stack_names() == ["local"]
    assert engine.stack_tags("local") is not None
    host = host_of(engine)
    assert host.started == 1, "one host served the term's calls"
    assert term.busy(), "the term counts its live host as a child"
    wait_until(lambda: not term.busy(), within=30, what="the idle host to exit")
    assert host_pids() == []
    # The next call starts another host of the same term; what the first wrote as config is still known.
    assert engine.plain_outputs("local")
    assert host.started == 2
    destroyed = engine.destroy("local")
    assert destroyed is not None
    assert not accepts(port)
    term.end(grace=5)
    assert host_pids() == []


def test_errors_come_back_as_the_engines_errors(fleet: Fleet, pulumi_env: PulumiEnv) -> None:
    term = Term("leader/2")
    engine = hosted_engine(fleet).in_term(term)
    with pytest.raises(InvalidInputError):
        engine.info("no-such-stack")
    term.end(grace=5)
    assert not term.busy()
    assert host_pids() == []
    with pytest.raises(TermEndedError):
        engine.list_stack_names()  # the host is a child of the term: none starts after its end


def test_the_service_process_never_loads_the_sdk(fleet: Fleet) -> None:
    """In a fresh interpreter (this one has the SDK from other tests): an `up` through the host, then the
    modules of that interpreter are listed."""
    script = textwrap.dedent(
        f"""
        import dataclasses, sys
        from automation.engine import Engine, Term
        from tests.automation.fleet import Fleet
        from tests.automation.test_engine_host import spec
        fleet = Fleet(
            root=__import__("pathlib").Path({str(fleet.root / "child")!r}), backend_url={fleet.backend_url!r}
        )
        config = dataclasses.replace(fleet.settings().engine_config(), fenced=True, host_idle_seconds=5)
        term = Term("leader/3")
        engine = Engine(config).in_term(term)
        engine.up(spec(fleet, {free_port()}))
        engine.destroy("local")
        term.end(grace=5)
        print(sorted(name for name in sys.modules if name == "grpc" or name.split(".")[0] == "pulumi"))
        """
    )
    output = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    ).stdout
    assert output.strip().splitlines()[-1] == "[]"


def test_ending_the_term_interrupts_the_hosts_up_and_leaves_no_child(
    fleet: Fleet, pulumi_env: PulumiEnv
) -> None:
    locks = pulumi_env.backend_dir / ".pulumi" / "locks"
    term = Term("leader/4")
    engine = hosted_engine(fleet).in_term(term)
    worker, failure = up_in_background(engine, spec(fleet, *(free_port() for _ in range(6))))
    wait_until(lambda: running_up(locks), within=120, what="`pulumi up` holding the stack's lock")
    term.end(grace=30)
    assert pulumi_descendants(os.getpid()) == [], "a pulumi child outlived its term"
    assert host_pids() == [], "the host outlived its term"
    worker.join(30)
    assert failure, "the interrupted up reported success"
    assert list(locks.rglob("*.json")) == [], "the cancelled up left its lock"
    with pytest.raises(TermEndedError):
        engine.up(spec(fleet, free_port()))


def _nice(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2 :].split()[16])


def _proxies_below(state: Path) -> list[int]:
    """The proxy processes whose command line names a file under `state` (their config)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):  # not a process, or one that ended
            cmdline = (entry / "cmdline").read_bytes()
            if b"stacks.forward_proxy" in cmdline and str(state).encode() in cmdline:
                found.append(int(entry.name))
    return found


def test_the_host_and_its_cli_yield_the_cpu_by_host_nice(fleet: Fleet, pulumi_env: PulumiEnv) -> None:
    """`host_nice`: the host runs that much nicer than the service, and so does the `pulumi up` it starts
    (its plugins inherit it from the CLI), so an `up` takes the cores only when the service leaves them
    (bench_running's lease window waited behind a resync's `up`s). The `local` proxies the `up` starts go
    back to the service's priority (root may lower a nice value: the test runs as root): they carry
    crawler traffic, and a lease waits for its proxy's acknowledgement (reasoned, not measured: on the
    benches' machine each proxy is its own autogroup, docs/decisions.md)."""
    locks = pulumi_env.backend_dir / ".pulumi" / "locks"
    term = Term("leader/nice")
    engine = hosted_engine(fleet, host_nice=7).in_term(term)
    worker, failure = up_in_background(engine, spec(fleet, *(free_port() for _ in range(3))))
    try:
        wait_until(lambda: running_up(locks), within=120, what="`pulumi up` holding the stack's lock")
        cli = running_up(locks)
        assert cli is not None
        [host] = host_pids()
        ours = _nice(os.getpid())
        assert _nice(host) == ours + 7
        assert _nice(cli) == ours + 7
        worker.join(300)
        assert not failure
        proxies = _proxies_below(fleet.local_state)
        assert len(proxies) == 3, proxies
        for proxy in proxies:  # what carries crawler traffic goes back to the service's (root may)
            assert _nice(proxy) == ours, proxies
    finally:
        term.end(grace=30)
    worker.join(30)


def test_a_foreign_lock_is_judged_by_the_service(fleet: Fleet, pulumi_env: PulumiEnv) -> None:
    """The host asks the service whether a lock's holder is gone (the service holds the cluster client)."""
    asked: list[str] = []

    def gone(holder: str) -> bool:
        asked.append(holder)
        return True

    port = free_port()
    term = Term("leader/5")
    engine = hosted_engine(fleet, foreign_lock_gone=gone).in_term(term)
    engine.up(spec(fleet, port))
    stack_locks = pulumi_env.backend_dir / ".pulumi" / "locks" / "organization" / "proxy-operator" / "local"
    stack_locks.mkdir(parents=True, exist_ok=True)
    (stack_locks / "0b8f8a0c-lock.json").write_text(
        '{"pid": 4242, "username": "someone", "hostname": "replica-b", "timestamp": "2026-12-06T00:00:00Z"}'
    )
    engine.up(spec(fleet, port, free_port()))
    assert asked == ["replica-b"]
    engine.destroy("local")
    term.end(grace=5)


HANGING_UP = textwrap.dedent(
    """
    import os, signal, sys, time
    marker = os.environ["HANGING_UP_MARKER"]
    if "up" not in sys.argv[1:]:
        os.execv(os.environ["REAL_PULUMI"], [os.environ["REAL_PULUMI"], *sys.argv[1:]])
    def interrupted(signum, frame):
        open(marker + ".tmp", "w").write("SIGINT")
        os.rename(marker + ".tmp", marker)
        sys.exit(130)
    signal.signal(signal.SIGINT, interrupted)
    open(marker + ".started", "w").write("")
    time.sleep(300)
    """
)


def hanging_cli(folder: Path) -> tuple[Path, Path]:
    """A `pulumi` that runs the real CLI for everything but `up`, which waits for a SIGINT and records it
    in the marker file: the up outlasts any deadline a test sets."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "pulumi"
    script.write_text(f"#!{sys.executable}\n{HANGING_UP}")
    script.chmod(0o755)
    return script, folder / "interrupted"


SERVICE = textwrap.dedent(
    """
    import dataclasses, sys
    from pathlib import Path
    from automation.engine import Engine, Term
    from tests.automation.fleet import Fleet
    from tests.automation.test_engine_host import spec
    fleet = Fleet(root=Path(sys.argv[1]), backend_url=sys.argv[2])
    config = dataclasses.replace(
        fleet.settings().engine_config(), fenced=True, host_idle_seconds=60, pulumi=Path(sys.argv[4])
    )
    engine = Engine(config).in_term(Term("leader/6", valid_until=float(sys.argv[3])))
    engine.up(spec(fleet, int(sys.argv[5])))
    """
)


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_the_hosts_cli_is_interrupted_when_the_service_is_killed_or_frozen(
    fleet: Fleet, pulumi_env: PulumiEnv, tmp_path: Path, how: str
) -> None:
    """Killed: the keepalive pipe closes, the host ends its term. Frozen (SIGSTOP): nobody renews the term,
    and the CLI's watchdog interrupts it at the deadline the host last passed on. The `up` is a stand-in
    that would wait five minutes (every other call is the real CLI's)."""
    cli, marker = hanging_cli(tmp_path / "cli")
    valid_until = time.monotonic() + (20.0 if how == "frozen" else 3600.0)
    env = {**os.environ, "HANGING_UP_MARKER": str(marker), "REAL_PULUMI": str(TOOLS_BIN / "pulumi")}
    command = [sys.executable, "-c", SERVICE, str(fleet.root / "svc"), fleet.backend_url]
    service = subprocess.Popen(
        [*command, repr(valid_until), str(cli), str(free_port())],
        env=env,
    )
    try:
        wait_until(lambda: Path(f"{marker}.started").exists(), within=120, what="the up to start")
        assert not marker.exists()
        (host,) = host_pids(service.pid)
        if how == "killed":
            service.kill()
        else:
            service.send_signal(signal.SIGSTOP)
            assert time.monotonic() < valid_until - 1, "the up started too late to tell"
        wait_until(marker.exists, within=60, what="the host's up to be interrupted")
        assert marker.read_text() == "SIGINT"
        if how == "frozen":
            assert time.monotonic() >= valid_until, "interrupted before the deadline"
            assert alive(host), "the host stays: its service may thaw and renew (only the CLI is stopped)"
        else:
            wait_until(lambda: not alive(host), within=30, what="the host to exit")
    finally:
        if how == "frozen":
            service.send_signal(signal.SIGCONT)
        service.kill()
        service.wait()


def test_a_killed_host_fails_its_calls_transiently_and_the_next_call_starts_another(fleet: Fleet) -> None:
    term = Term("leader/7")
    engine = hosted_engine(fleet).in_term(term)
    assert engine.list_stack_names() == []
    (pid,) = host_pids()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not term.busy(), within=30, what="the term to hear of its host's end")
    assert engine.list_stack_names() == []
    assert host_of(engine).started == 2
    term.end(grace=5)
    with pytest.raises(TermEndedError):
        engine.list_stack_names()


def test_a_call_in_flight_when_its_host_dies_fails_transiently(fleet: Fleet, pulumi_env: PulumiEnv) -> None:
    locks = pulumi_env.backend_dir / ".pulumi" / "locks"
    term = Term("leader/8")
    engine = hosted_engine(fleet).in_term(term)
    worker, failure = up_in_background(engine, spec(fleet, *(free_port() for _ in range(4))))
    wait_until(lambda: running_up(locks), within=120, what="`pulumi up` holding the stack's lock")
    (pid,) = host_pids()
    os.kill(pid, signal.SIGKILL)
    worker.join(60)
    assert failure, "the call did not fail"
    assert isinstance(failure[0], HostExitedError), failure
    wait_until(lambda: pulumi_descendants(os.getpid()) == [], within=60, what="the orphaned CLI to stop")
    term.end(grace=5)


def test_calls_outside_a_term_run_in_a_reads_only_host(fleet: Fleet) -> None:
    """A replica's `/v1/stacks` (no term): reads in a host, operations refused there as outside a term."""
    port = free_port()
    term = Term("leader/9")
    base = hosted_engine(fleet)
    base.in_term(term).up(spec(fleet, port))
    reads = base.reads_in_host()
    assert reads.list_stack_names() == ["local"]
    assert reads.stack_tags("local") is not None
    assert host_of(reads).started == 1
    assert len(host_pids()) == 2, "the term's host and the reads host"
    with pytest.raises(TermEndedError, match="reads-only"):
        reads.up(spec(fleet, port, free_port()))
    with pytest.raises(TermEndedError, match="reads-only"):
        reads.set_owner("local", "someone-else")
    assert base.in_term(term).stack_tags("local") == reads.stack_tags("local")
    host_of(reads).close()
    base.in_term(term).destroy("local")
    term.end(grace=5)
    wait_until(lambda: host_pids() == [], within=30, what="both hosts to exit")


def test_the_host_loads_no_model() -> None:
    """The host's own imports (before the SDK at its first call): no pydantic model, no pydantic (about 12
    MiB of its RSS when `stacks.models` loaded every model with `automation.errors`' one enum)."""
    script = "import sys, automation.engine.host; print(sorted(m for m in sys.modules if 'pydantic' in m))"
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"


SLOW_CONFIG = textwrap.dedent(
    """
    import os, sys, time
    marker = os.environ["SLOW_CONFIG_MARKER"]
    words = [arg for arg in sys.argv[1:] if not arg.startswith("-")]
    if words[:1] == ["config"]:
        open(marker + ".config", "w").write("")
        time.sleep(3)
    if words[:1] == ["up"]:
        open(marker + ".up", "w").write("")
    os.execv(os.environ["REAL_PULUMI"], [os.environ["REAL_PULUMI"], *sys.argv[1:]])
    """
)


def test_a_closed_term_starts_no_operation_in_its_host(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Term.close()` (the first step of a step-down) reaches the host: an `up` in flight whose config is
    being set when the term closes never starts its `pulumi up`, and a new operation is refused in the
    service; reads go on. The CLI is the real one behind a wrapper that makes `config set-all` take 3 s."""
    cli = tmp_path / "cli" / "pulumi"
    cli.parent.mkdir()
    cli.write_text(f"#!{sys.executable}\n{SLOW_CONFIG}")
    cli.chmod(0o755)
    marker = tmp_path / "marker"
    monkeypatch.setenv("SLOW_CONFIG_MARKER", str(marker))
    monkeypatch.setenv("REAL_PULUMI", str(TOOLS_BIN / "pulumi"))
    term = Term("leader/10")
    engine = hosted_engine(fleet, pulumi=cli).in_term(term)
    worker, failure = up_in_background(engine, spec(fleet, free_port()))
    wait_until(Path(f"{marker}.config").exists, within=120, what="the up to set its config")
    term.close()
    worker.join(60)
    assert failure, "the up ran after its term closed"
    assert isinstance(failure[0], TermEndedError), failure
    assert not Path(f"{marker}.up").exists(), "`pulumi up` started after the term closed"
    with pytest.raises(TermEndedError, match="`destroy` was not started"):
        engine.destroy("local")
    assert engine.list_stack_names() == ["local"]  # reads go on in a closed term (the stack was created)
    term.end(grace=5)
