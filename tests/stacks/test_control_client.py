"""`ControlClient`: control requests over one kept, pipelined connection per channel, against the real
control servers (`control.start_unix`, `control.start`, `control.start_tcp`) on sockets of the test's own,
on the session's loop of tests/stacks/conftest.py."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from stacks.forward_proxy import control, control_client
from stacks.forward_proxy.control import ControlError
from stacks.forward_proxy.control_client import ControlClient
from stacks.forward_proxy.users import LeaseUsers

Answer = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class Channel:
    """A unix control server that answers each request with its `n` and counts its sessions."""

    def __init__(self, path: Path, delays: dict[int, float] | None = None) -> None:
        self.path = str(path)
        self.delays = delays or {}
        self.sessions: set[int] = set()
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        task = asyncio.current_task()
        self.sessions.add(id(task))
        await asyncio.sleep(self.delays.get(request.get("n", -1), random.random() / 1000))
        return {"ok": True, "n": request.get("n")}

    async def start(self) -> None:
        """`control.start_unix`'s server (the same sessions), keeping each session's writer for `stop`."""

        def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Awaitable[None]:
            self.writers.append(writer)
            return control._session(reader, writer, self.answer)

        self.server = await asyncio.start_unix_server(session, self.path, limit=control.MAX_LINE)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:  # the sessions too: the listener process is gone
            writer.close()
        self.writers.clear()
        await self.server.wait_closed()


@contextlib.asynccontextmanager
async def serving(channel: Channel, client: ControlClient) -> AsyncIterator[ControlClient]:
    """The channel started, the client given; both closed at the end."""
    await channel.start()
    try:
        yield client
    finally:
        await client.close()
        await channel.stop()


def test_concurrent_calls_share_one_connection_and_each_gets_its_own_answer(
    tmp_path: Path, current_event_loop: asyncio.AbstractEventLoop
) -> None:
    async def test() -> None:
        channel = Channel(tmp_path / "c.ctl")
        async with serving(channel, ControlClient()) as client:
            calls = [client.call(channel.path, {"op": "hello", "n": n}, wait=10) for n in range(200)]
            answers = await asyncio.gather(*calls)
            assert [a["n"] for a in answers] == list(range(200))
            assert len(channel.sessions) == 1, "a connection per call, not one kept"
            assert len(client) == 1

    current_event_loop.run_until_complete(test())


def test_a_listener_started_again_is_reached_on_a_new_connection(
    tmp_path: Path, current_event_loop: asyncio.AbstractEventLoop
) -> None:
    async def test() -> None:
        channel = Channel(tmp_path / "c.ctl")
        async with serving(channel, ControlClient()) as client:
            assert (await client.call(channel.path, {"op": "hello", "n": 1}, wait=10))["n"] == 1
            await channel.stop()  # the listener process ends and another takes its socket
            await asyncio.sleep(0)  # not needed for the retry, but lets the client see the end first
            await channel.start()
            assert (await client.call(channel.path, {"op": "hello", "n": 2}, wait=10))["n"] == 2
            assert len(channel.sessions) == 2

    current_event_loop.run_until_complete(test())


def test_a_kept_connection_found_dead_on_write_is_retried_once_on_a_new_one(
    tmp_path: Path, current_event_loop: asyncio.AbstractEventLoop
) -> None:
    """The kept connection's listener closed it without the client noticing yet (no turn of the loop between):
    the request goes again on a new connection, and is answered."""

    async def test() -> None:
        channel = Channel(tmp_path / "c.ctl")
        async with serving(channel, ControlClient()) as client:
            await client.call(channel.path, {"op": "hello", "n": 1}, wait=10)
            (kept,) = client._connections.values()
            kept.writer.transport.abort()  # as if the peer reset it: the next write or read fails
            assert (await client.call(channel.path, {"op": "hello", "n": 2}, wait=10))["n"] == 2

    current_event_loop.run_until_complete(test())


def test_a_call_past_its_wait_fails_alone_and_the_next_gets_its_own_answer(
    tmp_path: Path, current_event_loop: asyncio.AbstractEventLoop
) -> None:
    async def test() -> None:
        channel = Channel(tmp_path / "c.ctl", delays={1: 0.5})
        async with serving(channel, ControlClient()) as client:
            slow = asyncio.create_task(client.call(channel.path, {"op": "hello", "n": 1}, wait=0.1))
            await asyncio.sleep(0)
            quick = client.call(channel.path, {"op": "hello", "n": 2}, wait=10)
            assert (await quick)["n"] == 2, "the late answer of the call that gave up was taken as the next's"
            with pytest.raises(ControlError, match="TimeoutError"):
                await slow
            assert (await client.call(channel.path, {"op": "hello", "n": 3}, wait=10))["n"] == 3
            assert len(channel.sessions) == 1

    current_event_loop.run_until_complete(test())


def test_an_idle_connection_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, current_event_loop: asyncio.AbstractEventLoop
) -> None:
    monkeypatch.setattr(control_client, "SWEEP_SECONDS", 0.0)

    async def test() -> None:
        channel = Channel(tmp_path / "c.ctl")
        async with serving(channel, ControlClient(idle=0.05)) as client:
            await client.call(channel.path, {"op": "hello", "n": 1}, wait=10)
            assert len(client) == 1
            await asyncio.sleep(0.1)
            await client.call(channel.path, {"op": "hello", "n": 2}, wait=10)
            assert len(channel.sessions) == 2, "the idle connection was kept"

    current_event_loop.run_until_complete(test())


def test_no_listener_and_a_refusal_are_control_errors(
    tmp_path: Path, current_event_loop: asyncio.AbstractEventLoop
) -> None:
    async def test() -> None:
        users = LeaseUsers()
        server = await control.start(str(tmp_path / "u.ctl"), users)
        client = ControlClient()
        try:
            with pytest.raises(ControlError, match="control channel"):
                await client.call(str(tmp_path / "none.ctl"), {"op": "hello"}, wait=5)
            with pytest.raises(ControlError, match="unknown or ended user"):
                await client.call(str(tmp_path / "u.ctl"), {"op": "renew", "user": "x", "ttl": 5}, wait=5)
            add = {"op": "add", "user": "lease-a", "password": "pw", "ttl": 60}
            assert (await client.call(str(tmp_path / "u.ctl"), add, wait=5))["ok"] is True
            assert users.check(b"lease-a", b"pw")
        finally:
            await client.close()
            server.close()
            await server.wait_closed()

    current_event_loop.run_until_complete(test())


def test_a_tcp_channel_with_its_token_over_a_kept_connection(
    current_event_loop: asyncio.AbstractEventLoop,
) -> None:
    async def test() -> None:
        users = LeaseUsers()
        server = await control.start_tcp("127.0.0.1", 0, users, password=lambda: "proxy-password")
        port = server.sockets[0].getsockname()[1]
        client = ControlClient()
        try:
            for i in range(5):
                add = {"op": "add", "user": f"lease-{i}", "password": "pw", "ttl": 60}
                await client.call(f"tcp://127.0.0.1:{port}", add, wait=5, password="proxy-password")
            assert len(client) == 1
            assert all(users.check(f"lease-{i}".encode(), b"pw") for i in range(5))
            with pytest.raises(ControlError, match="refused"):
                await client.call(f"tcp://127.0.0.1:{port}", {"op": "hello"}, wait=5, password="wrong")
        finally:
            await client.close()
            server.close()
            await server.wait_closed()

    current_event_loop.run_until_complete(test())


def test_a_client_used_from_one_event_loop_then_another(tmp_path: Path) -> None:
    """A client outliving its event loop (a test's, a service's restart in process): the loop's end closed
    its kept connection, and a call from the next loop opens a new one. Each loop runs in a thread of its
    own here, the channel in a third."""
    path = str(tmp_path / "c.ctl")
    ready, stop = threading.Event(), threading.Event()

    def serve() -> None:
        async def main() -> None:
            server = await control.start(path, LeaseUsers())
            ready.set()
            await asyncio.to_thread(stop.wait)
            server.close()
            await server.wait_closed()

        asyncio.run(main())

    server = threading.Thread(target=serve)
    server.start()
    try:
        assert ready.wait(10)
        client = ControlClient()
        with ThreadPoolExecutor(1) as pool:
            for _ in range(2):  # asyncio.run: a new loop each time, the previous one closed
                answer = pool.submit(asyncio.run, client.call(path, {"op": "hello"}, wait=5)).result(10)
                assert answer["ok"] is True
                assert len(client) == 0, "the loop's end did not close its connection"
    finally:
        stop.set()
        server.join(10)
