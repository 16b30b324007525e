"""Recognising our forward proxy from /proc, on a real proxy process (started by the local provider's own
`create`, no engine): the rule the local program's `read` and the service's probe gate share."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacks.forward_proxy import identity
from stacks.forward_proxy.identity import ProcessRef
from stacks.programs import local_process as proc
from stacks.programs.local import LocalProxyProvider
from tests.ports import free_port


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[ProcessRef, int]]:
    """A forward proxy on a free loopback port: its recorded identity and its port."""
    port = free_port()
    props = {"state_dir": str(tmp_path), "stem": "crawl_id", "bind_address": "127.0.0.1", "port": port}
    created = LocalProxyProvider().create({**props, "protocol": "http", "username": "u", "password": "p"})
    ref = ProcessRef.from_instance_id(created.id)
    assert ref is not None
    assert ref == ProcessRef(pid=created.outs["pid"], start_time=created.outs["start_time"])
    try:
        yield ref, port
    finally:
        proc.stop(ref, grace=1)


def test_instance_ids_round_trip_and_anything_else_names_no_process() -> None:
    ref = ProcessRef(pid=4242, start_time=987654)
    assert ProcessRef.from_instance_id(ref.instance_id) == ref
    for other in (None, "", "4242", "4242-", "-1", "abc-12", "12-3-4", "projects/p/zones/z/instances/vm"):
        assert ProcessRef.from_instance_id(other) is None, other


def test_the_recorded_proxy_holding_its_port_is_the_listener(running: tuple[ProcessRef, int]) -> None:
    ref, port = running
    assert identity.is_ours(ref)
    assert identity.listener_refusal(ref, port=port) is None
    other = free_port()
    assert (
        identity.listener_refusal(ref, port=other)
        == f"its process (pid {ref.pid}) does not listen on port {other}"
    )


def test_a_dead_proxy_or_a_reused_pid_is_not_the_listener(running: tuple[ProcessRef, int]) -> None:
    ref, port = running
    later = ProcessRef(pid=ref.pid, start_time=ref.start_time + 1)  # the pid, taken by a later process
    assert not identity.is_ours(later)
    assert identity.listener_refusal(later, port=port) == f"its process (pid {ref.pid}) is gone"
    proc.stop(ref, grace=1)
    assert not identity.is_ours(ref)
    assert identity.listener_refusal(ref, port=port) == f"its process (pid {ref.pid}) is gone"


def test_a_live_process_of_another_program_is_not_the_listener() -> None:
    me = ProcessRef(pid=os.getpid(), start_time=identity.start_time(os.getpid()) or 0)
    assert identity.is_running(me)
    assert not identity.is_ours(me)  # pytest, not `python -m stacks.forward_proxy`
    assert identity.listener_refusal(me, port=free_port()) == f"pid {me.pid} now runs another program"


def test_within_a_second_of_a_full_check_a_probe_reads_one_descriptor_and_nothing_else(
    running: tuple[ProcessRef, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, port = running
    assert identity.listener_refusal(ref, port=port, now=1000.0) is None  # every check, remembered
    reads: list[int] = []
    real_start_time, real_command_line = identity.start_time, identity.command_line

    def start_time(pid: int) -> int | None:
        reads.append(pid)
        return real_start_time(pid)

    def command_line(pid: int) -> list[str]:
        reads.append(pid)
        return real_command_line(pid)

    monkeypatch.setattr(identity, "start_time", start_time)
    monkeypatch.setattr(identity, "command_line", command_line)
    assert identity.listener_refusal(ref, port=port, now=1000.9) is None
    assert reads == []
    assert identity.listener_refusal(ref, port=port, now=1001.0) is None  # a second on: every check again
    assert reads == [ref.pid, ref.pid]


def test_a_proxy_gone_within_the_second_is_refused_at_once_with_its_reason(
    running: tuple[ProcessRef, int],
) -> None:
    ref, port = running
    assert identity.listener_refusal(ref, port=port, now=2000.0) is None
    proc.stop(ref, grace=1)
    assert identity.listener_refusal(ref, port=port, now=2000.1) == f"its process (pid {ref.pid}) is gone"


def test_a_new_socket_on_the_port_of_a_remembered_process_is_checked_again_in_full() -> None:
    """The pid reused within the second by a program that binds the same port, as near as one process can
    stage it: the pid is remembered as a proxy's, its socket closed and another bound in its place."""
    me = ProcessRef(pid=os.getpid(), start_time=identity.start_time(os.getpid()) or 0)
    first = socket.create_server(("127.0.0.1", 0))
    port = first.getsockname()[1]
    try:
        assert identity.holds_listener(me.pid, port)  # remembered: descriptor and inode
        identity._IDENTIFIED[me.pid] = (me.start_time, 3000.0)  # as if it passed as our proxy just now
        assert identity.listener_refusal(me, port=port, now=3000.5) is None  # the very socket: it holds
        first.close()
        second = socket.create_server(("127.0.0.1", port))
        try:
            refused = identity.listener_refusal(me, port=port, now=3000.6)
            assert refused == f"pid {me.pid} now runs another program"
        finally:
            second.close()
    finally:
        first.close()
        identity._IDENTIFIED.pop(me.pid, None)
