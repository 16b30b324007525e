"""A new proxy instance on a tcp control channel (a proxy pod's) holds the login of a lease user it has never
seen until the service's `follow` brings the user, instead of a 407 (`LeaseUsers.hold`): real forward
proxy processes on 127.0.0.1, the service's own LeaseUsers and MemoryStore.

On the test node a rollout's new pod once took traffic before the service's follow round reached it, and a
live lease got one 407 (tests/kube/test_service_pods.py). Each test here fails on the code before, where an
unknown user was refused at once: the held request got a 407 (or, with the hold and no arrival, the proxy
never waited at all). What must not wait: a wrong password of a known user, a user this instance saw
revoked, a name that is no lease user, and anything after the hold.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.discovery.lease_users import LeaseUsers
from service.discovery.memory import MemoryStore
from service.discovery.store import AcquireRequest, LeaseRecord
from service.inventory import Inventory
from stacks.forward_proxy import control
from stacks.forward_proxy.config import Limits
from tests.ports import free_port
from tests.security.loopback_site import serve_page
from tests.security.tunnels import run_proxy, socks_connect, socks_login
from tests.service.conftest import endpoint

NOW = 1_800_000_000.0
PASSWORD = "Pass1234"  # run_proxy's static password: the token's key


@pytest.fixture
def site() -> Iterator[int]:
    with serve_page(b"through the proxy\n") as port:
        yield port


def fetch(port: int, site: int, user: str, password: str, *, timeout: float = 30) -> int:
    with httpx.Client(proxy=f"http://{user}:{password}@127.0.0.1:{port}", timeout=timeout) as client:
        return client.get(f"http://127.0.0.1:{site}/").status_code


def add(channel: str, user: str, password: str) -> None:
    request = {"op": "add", "user": user, "password": password, "ttl": 300}
    asyncio.run(control.call(channel, request, wait=5, password=PASSWORD))


def held(answer: Future[int], *, seconds: float = 1.0) -> bool:
    """Still waiting `seconds` after it was sent (the proxy holds it)."""
    try:
        answer.result(timeout=seconds)
    except TimeoutError:
        return True
    return False


async def one_lease() -> tuple[MemoryStore, LeaseRecord]:
    store = MemoryStore()
    request = AcquireRequest(
        client="c", target="*", candidates=["default/a"], count=1, ttl=60, cooldown=0, lease_ids=["l1"]
    )
    [lease] = (await store.acquire(request, now=NOW)).leases
    return store, lease


def test_a_new_instance_holds_a_live_lease_until_follow_brings_its_user(tmp_path: Path, site: int) -> None:
    """A rollout as the service sees it: the lease was issued to the old process; a new process on the same
    channel (a new pod) gets a request with the lease's credentials before the follow round: the request
    waits, the round (`hello`, a new instance, `add` by digest) admits it, 200."""
    channel = f"tcp://127.0.0.1:{free_port()}"
    egress = {"allow": [{"cidr": "127.0.0.1/32", "ports": [site]}]}
    sent: list[str] = []

    async def recording(target: str, request: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        sent.append(str(request["op"]))
        return await control.call(target, request, **kwargs)

    inventory = Inventory()
    inventory.replace_all([endpoint("a", username="crawler", password=PASSWORD, control=channel)])
    users = LeaseUsers(inventory=inventory, enabled=True, call=recording)

    async def issue() -> tuple[MemoryStore, str]:
        store, lease = await one_lease()
        issued, failed = await users.issue([lease], now=NOW)
        assert failed == []
        await users.follow(now=NOW + 1, lookup=store.get_lease)  # the old process is known to follow
        return store, issued["l1"].password

    with run_proxy(tmp_path, control=channel, egress=egress) as old:
        store, password = asyncio.run(issue())
        assert fetch(old, site, "lease-l1", password) == 200
    with run_proxy(tmp_path, control=channel, egress=egress) as new, ThreadPoolExecutor(1) as pool:
        answer = pool.submit(fetch, new, site, "lease-l1", password)
        assert held(answer), f"answered {answer.result()} at once: the new instance did not hold the login"
        sent.clear()
        asyncio.run(users.follow(now=NOW + 10, lookup=store.get_lease))
        assert sent == ["hello", "add"]
        assert answer.result(timeout=10) == 200


def test_what_must_not_wait_is_refused_at_once(tmp_path: Path, site: int) -> None:
    """During a long hold: a known user's wrong password, a user seen and revoked, a name that is no lease
    user, and no credentials at all answer 407 at once (the fetch's 5 s timeout is far inside the hold);
    a held login of a user that never arrives gets its 407 when the hold ends."""
    channel = f"tcp://127.0.0.1:{free_port()}"
    egress = {"allow": [{"cidr": "127.0.0.1/32", "ports": [site]}]}
    with run_proxy(tmp_path, control=channel, egress=egress, limits={"lease_hold_seconds": 120}) as port:
        add(channel, "lease-known", "right")
        assert fetch(port, site, "lease-known", "right", timeout=5) == 200
        assert fetch(port, site, "lease-known", "wrong", timeout=5) == 407
        add(channel, "lease-gone", "pw")
        asyncio.run(control.call(channel, {"op": "revoke", "user": "lease-gone"}, wait=5, password=PASSWORD))
        assert fetch(port, site, "lease-gone", "pw", timeout=5) == 407
        assert fetch(port, site, "someone", "pw", timeout=5) == 407
        with httpx.Client(proxy=f"http://127.0.0.1:{port}", timeout=5) as anonymous:
            assert anonymous.get(f"http://127.0.0.1:{site}/").status_code == 407

    with run_proxy(tmp_path, control=channel, egress=egress, limits={"lease_hold_seconds": 2}) as port:
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(fetch, port, site, "lease-never", "pw")
            assert held(answer, seconds=0.5)
            assert answer.result(timeout=20) == 407  # the hold ended: refused, nothing admitted
        assert fetch(port, site, "lease-late", "pw", timeout=5) == 407  # after the hold: at once


def test_a_held_socks5_login_is_admitted_when_its_user_arrives(tmp_path: Path, site: int) -> None:
    """The same hold for SOCKS5's user/password login (socks.py): held, then admitted, the tunnel opened."""
    channel = f"tcp://127.0.0.1:{free_port()}"
    egress = {"allow": [{"cidr": "127.0.0.1/32", "ports": [site]}]}

    def through_socks(port: int) -> int:
        """Log in as lease-s, ask for the site: the reply code (0: the tunnel is open)."""
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            socks_login(sock, "lease-s", "pw")  # asserts the login succeeded
            return socks_connect(sock, site)

    with (
        run_proxy(tmp_path, control=channel, egress=egress, protocol="socks5") as port,
        ThreadPoolExecutor(1) as pool,
    ):
        answer = pool.submit(through_socks, port)
        assert held(answer)
        add(channel, "lease-s", "pw")
        assert answer.result(timeout=10) == 0


def test_the_hold_is_bounded_and_left_out_of_a_file_that_keeps_the_default() -> None:
    """The file a pod's Secret holds is what it was before the hold existed (no pod rolls for it)."""
    assert "lease_hold_seconds" not in Limits().to_json()
    assert Limits(lease_hold_seconds=0).to_json()["lease_hold_seconds"] == 0
    for bad in (-1, 301, True, "5"):
        with pytest.raises(ValueError, match="lease_hold_seconds"):
            Limits(lease_hold_seconds=bad)  # type: ignore[arg-type]
