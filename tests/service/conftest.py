"""Fixtures of the discovery and health tests: a live uvicorn, a real redis-server, real pproxy processes."""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry

from service.api import create_app
from service.api_server import server_config
from service.auth import TokenAuthenticator, hash_token
from service.discovery.memory import MemoryStore
from service.discovery.redis_store import RedisStore
from service.discovery.service import DiscoveryService
from service.discovery.store import Store
from service.inventory import Health, HealthState, Inventory, ProxyEndpoint
from service.settings import DiscoverySettings
from tests.ports import free_port
from tests.pproxy_command import PPROXY

TOKENS = {
    "crawler-a": ("token-a", ["lease", "report"]),
    "crawler-b": ("token-b", ["lease", "report"]),
    "reporter": ("token-r", ["report"]),
    "admin": ("token-admin", ["admin"]),
    "owner": ("token-owner", ["lease", "report"]),  # a team that owns its pool: leaseShare 1 (below)
}
TOKEN_SETTINGS = {"owner": {"leaseShare": 1.0}}


def auth(client: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[client][0]}"}


# The fair-share limits at their most generous, for tests that hand one client a whole small pool.
FAIR_SHARE_OFF = {"lease_share": 1.0, "lease_rate": 100_000.0, "lease_burst": 100_000}


@dataclass
class FakeClock:
    """Wall-clock seconds that move only when a test says so."""

    now: float = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def endpoint(name: str, *, port: int = 3128, pool: str | None = "main", **extra: Any) -> ProxyEndpoint:
    fields: dict[str, Any] = {
        "key": f"default/{name}",
        "namespace": "default",
        "name": name,
        "provider": "local",
        "pool": pool,
        "protocol": "http",
        "host": "127.0.0.1",
        "port": port,
        "username": "user",
        "password": "p@ss word",
    }
    fields.update(extra)
    return ProxyEndpoint(**fields)


def healthy_inventory(names: list[str], **extra: Any) -> Inventory:
    inventory = Inventory()
    inventory.replace_all([endpoint(n, **extra) for n in names])
    for n in names:
        inventory.set_health(f"default/{n}", Health(state=HealthState.healthy, egress_ip="127.0.0.1"))
    return inventory


class UvicornThread:
    """A real uvicorn server on 127.0.0.1 and a free port (or `port`: a restart on the same one), in a
    thread; `stop()` ends both."""

    def __init__(self, app: Any, *, port: int = 0) -> None:
        # The server `serve` runs (uvloop, httptools), in this thread's own loop.
        config = server_config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    def start(self) -> UvicornThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    @property
    def url(self) -> str:
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "uvicorn did not stop"


@dataclass
class Api:
    """One running replica and what it was built from (tests reach in to set health or move time)."""

    server: UvicornThread
    inventory: Inventory
    discovery: DiscoveryService
    clock: FakeClock
    registry: CollectorRegistry
    errors_reported: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)


class RedisServer:
    def __init__(self, binary: str, tmp: Path) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(tmp),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"
        deadline = time.monotonic() + 10
        while not _answers(self.port):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(16).startswith(b"+PONG")
    return False


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: `make test` installs it (scripts/install-system-deps.sh)")
    server = RedisServer(binary, tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.json"
    entries = [
        {"name": n, "scopes": s, "sha256": hash_token(t), **TOKEN_SETTINGS.get(n, {})}
        for n, (t, s) in TOKENS.items()
    ]
    path.write_text(json.dumps(entries))
    return path


@pytest.fixture(params=["memory", "redis", "redis-set"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


StoreFactory = Callable[[], Store]


@pytest.fixture
def store_factory(store_kind: str, request: pytest.FixtureRequest) -> StoreFactory:
    """New store objects of the parametrised kind; Redis ones share one key prefix (= one shared state).

    `redis` sends small candidate lists with each call; `redis-set` always goes through uploaded candidate
    sets, the path that fleets larger than 64 proxies take.
    """
    if store_kind == "memory":
        return MemoryStore
    server: RedisServer = request.getfixturevalue("redis_server")
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    small_set = 0 if store_kind == "redis-set" else 64
    return lambda: RedisStore.from_url(server.url, prefix=prefix, small_set=small_set)


ApiFactory = Callable[..., Api]


@pytest.fixture
def start_api(tokens_file: Path, store_factory: StoreFactory) -> Iterator[ApiFactory]:
    """Start replicas: `start_api(inventory=..., clock=..., **settings)`; all stopped at teardown. `port`
    starts one where an earlier one was stopped: a restart, with a fresh store unless `store` is given."""
    running: list[Api] = []

    def start(
        *,
        inventory: Inventory,
        clock: FakeClock | None = None,
        stacks: Any = None,
        store: Store | None = None,
        port: int = 0,
        **settings: Any,
    ) -> Api:
        clock = clock or FakeClock()
        store = store or store_factory()
        reported: list[str] = []
        for name, off in FAIR_SHARE_OFF.items():  # tests of other rules; test_fair_share.py has them on
            settings.setdefault(name, off)
        discovery = DiscoveryService(
            inventory=inventory,
            store=store,
            settings=DiscoverySettings(**settings),
            clock=clock,
            rng=random.Random(7),
            on_error_report=reported.append,
        )

        @asynccontextmanager
        async def lifespan(_app: Any) -> Any:
            yield
            await store.close()

        registry = CollectorRegistry()
        app = create_app(
            inventory=inventory,
            discovery=discovery,
            authenticator=TokenAuthenticator(path=tokens_file),
            registry=registry,
            stack_inspector=stacks,
            lifespan=lifespan,
        )
        api = Api(UvicornThread(app, port=port).start(), inventory, discovery, clock, registry, reported)
        running.append(api)
        return api

    yield start
    for api in running:
        api.server.stop()


class Pproxy:
    """A real pproxy process on loopback (HTTP+CONNECT or SOCKS5, with user:pass); stopped by pid."""

    def __init__(
        self, *, protocol: str = "http", port: int | None = None, credentials: str = "user:pass"
    ) -> None:
        self.port = port or free_port()
        self.protocol = protocol
        self.credentials = credentials
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Pproxy:
        uri = f"{self.protocol}://127.0.0.1:{self.port}#{self.credentials}"
        self.process = subprocess.Popen(
            [*PPROXY, "-l", uri], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while not _listening(self.port):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError("pproxy did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
        return True
    return False


@pytest.fixture
def pproxies() -> Iterator[Callable[..., Pproxy]]:
    started: list[Pproxy] = []

    def start(**kwargs: Any) -> Pproxy:
        proxy = Pproxy(**kwargs).start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


@pytest.fixture
def echo_url() -> Iterator[str]:
    """The service's own echo route on a live uvicorn: the default probe URL."""
    inventory = Inventory()
    discovery = DiscoveryService(inventory=inventory, store=MemoryStore(), settings=DiscoverySettings())
    app = create_app(inventory=inventory, discovery=discovery, authenticator=TokenAuthenticator([]))
    server = UvicornThread(app).start()
    yield f"{server.url}/v1/echo"
    server.stop()
