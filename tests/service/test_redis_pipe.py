"""The pipelined Redis connection: replies reach their callers in order, however they arrive; scripts Redis
forgot are loaded again; a lost connection fails what waited on it and the next command connects again."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from service.discovery.redis_pipe import RedisPipe, _pack, _parse
from tests.service.conftest import RedisServer


def test_replies_parse_only_once_complete() -> None:
    wire = b"*4\r\n$3\r\nabc\r\n$-1\r\n:42\r\n*2\r\n+OK\r\n$0\r\n\r\n-ERR no\r\n"
    for cut in range(len(wire) - 10):
        assert _parse(wire[:cut], 0) is None or cut >= wire.index(b"-ERR")
    reply, position = _parse(wire, 0)  # type: ignore[misc]
    assert reply == ["abc", None, 42, ["OK", ""]]
    error, end = _parse(wire, position)  # type: ignore[misc]
    assert isinstance(error, ResponseError)
    assert end == len(wire)
    assert isinstance(_parse(b"-NOSCRIPT No matching script\r\n", 0)[0], NoScriptError)  # type: ignore[index]
    assert _pack(("SET", "k", "vé")) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\xc3\xa9\r\n"


def _run(redis_server: RedisServer, scenario: Callable[[RedisPipe, aioredis.Redis], Awaitable[None]]) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        pipe = RedisPipe.for_client(client)
        assert pipe is not None
        try:
            await scenario(pipe, client)
        finally:
            await pipe.close()
            await client.aclose()

    asyncio.run(main())


def test_concurrent_commands_get_their_own_replies(redis_server: RedisServer) -> None:
    async def scenario(pipe: RedisPipe, _: aioredis.Redis) -> None:
        replies = await asyncio.gather(*(pipe.call("ECHO", f"m{i}") for i in range(500)))
        assert replies == [f"m{i}" for i in range(500)]
        with pytest.raises(ResponseError):
            await pipe.call("NOSUCHCOMMAND")
        assert await pipe.call("ECHO", "still in step") == "still in step"

    _run(redis_server, scenario)


def test_a_script_redis_forgot_is_loaded_again(redis_server: RedisServer) -> None:
    source = "return ARGV[1] .. KEYS[1]"
    sha = hashlib.sha1(source.encode()).hexdigest()

    async def scenario(pipe: RedisPipe, client: aioredis.Redis) -> None:
        await client.script_flush()
        assert await pipe.script(sha, source, ["k"], ["v-"]) == "v-k"
        assert await pipe.script(sha, source, ["k2"], ["v-"]) == "v-k2"

    _run(redis_server, scenario)


def test_a_lost_connection_is_opened_again(redis_server: RedisServer) -> None:
    async def scenario(pipe: RedisPipe, client: aioredis.Redis) -> None:
        first = await pipe.call("CLIENT", "ID")
        await client.execute_command("CLIENT", "KILL", "ID", str(first))
        outcome: Any
        try:
            outcome = await pipe.call("ECHO", "after")
        except RedisConnectionError:
            outcome = "failed once"
        assert outcome in ("after", "failed once")
        assert await pipe.call("ECHO", "again") == "again"
        assert await pipe.call("CLIENT", "ID") != first

    _run(redis_server, scenario)


def test_the_database_of_the_client_is_used(redis_server: RedisServer) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(redis_server.url.rsplit("/", 1)[0] + "/5", decode_responses=True)
        pipe = RedisPipe.for_client(client)
        assert pipe is not None
        try:
            await pipe.call("SET", "pipe-db-test", "here")
            assert await client.get("pipe-db-test") == "here"
        finally:
            await pipe.close()
            await client.aclose()

    asyncio.run(main())


def test_other_connections_stay_with_redis_py() -> None:
    assert RedisPipe.for_client(aioredis.Redis.from_url("rediss://127.0.0.1:1/0")) is None
    assert RedisPipe.for_client(aioredis.Redis.from_url("unix:///tmp/nothing.sock")) is None
