"""Lease users pushed to a proxy's `tcp://` control channel (proxy pods): to every address its name resolves
to, with the token of the proxy's own password, on real forward proxy processes.

Two processes stand for a proxy's two pods during a rollout: one listens for control on 127.0.0.1:P, the
other on 127.0.0.2:P, and the injected resolver names both (as the headless Service's DNS name would). A
lease is answered only once both acknowledged; renew and revoke reach both; a name that resolves to
nothing, or to an address where nobody listens, answers no lease. Each test fails on the code before,
where `control` was a unix socket path only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.discovery.control_targets import resolve_addresses, targets
from service.discovery.lease_users import LeaseUsers
from service.discovery.memory import MemoryStore
from service.discovery.store import AcquireRequest, LeaseRecord
from service.inventory import Inventory
from stacks.forward_proxy import control
from tests.ports import free_port
from tests.security.loopback_site import serve_page
from tests.security.tunnels import run_proxy
from tests.service.conftest import endpoint

NOW = 1_800_000_000.0
NAME = "px-crawl-a-control.proxies.svc.cluster.local"
PASSWORD = "Pass1234"  # run_proxy's static password: the token's key
POD_ADDRESSES = ["127.0.0.1", "127.0.0.2"]
# No lease hold: these tests read what each process knows at each step, a refusal of a user it was not
# given at once (the hold, a new pod's wait for its users: tests/security/test_lease_hold.py).
NO_HOLD = {"lease_hold_seconds": 0}


@dataclass
class Pods:
    proxy_ports: list[int]  # where each pod's proxy listens (all on 127.0.0.1)
    control_port: int


@pytest.fixture
def site() -> Iterator[int]:
    with serve_page(b"through the proxy\n") as port:
        yield port


@pytest.fixture
def pods(tmp_path: Path, site: int) -> Iterator[Pods]:
    """Two pods of one proxy: control on 127.0.0.1:P and on 127.0.0.2:P, the proxy's password."""
    control_port = free_port()
    egress = {"allow": [{"cidr": "127.0.0.1/32", "ports": [site]}]}
    with ExitStack() as stack:
        ports = [
            stack.enter_context(
                run_proxy(tmp_path, control=f"tcp://{address}:{control_port}", egress=egress, limits=NO_HOLD)
            )
            for address in POD_ADDRESSES
        ]
        yield Pods(proxy_ports=ports, control_port=control_port)


def lease_users(
    pods: Pods, *, resolved: list[str] = POD_ADDRESSES, password: str = PASSWORD
) -> tuple[LeaseUsers, list[str]]:
    """LeaseUsers over one endpoint whose control is NAME, resolved to `resolved`; the names asked for."""
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        asked.append(f"{host}:{port}")
        return list(resolved)

    inventory = Inventory()
    control = f"tcp://{NAME}:{pods.control_port}"
    inventory.replace_all([endpoint("a", username="crawler", password=password, control=control)])
    return LeaseUsers(inventory=inventory, enabled=True, resolve=resolve), asked


async def one_lease() -> tuple[MemoryStore, LeaseRecord]:
    """Lease l1 on the proxy at NOW, for 60 s."""
    store = MemoryStore()
    request = AcquireRequest(
        client="c", target="*", candidates=["default/a"], count=1, ttl=60, cooldown=0, lease_ids=["l1"]
    )
    [lease] = (await store.acquire(request, now=NOW)).leases
    return store, lease


def fetch(port: int, site: int, user: str, password: str) -> int:
    with httpx.Client(proxy=f"http://{user}:{password}@127.0.0.1:{port}", timeout=10) as client:
        return client.get(f"http://127.0.0.1:{site}/").status_code


def test_a_lease_user_is_on_every_pod_until_revoked(pods: Pods, site: int) -> None:
    users, asked = lease_users(pods)
    _, lease = asyncio.run(one_lease())
    issued, failed = asyncio.run(users.issue([lease], now=NOW))
    user = issued["l1"]

    assert failed == []
    assert asked == [f"{NAME}:{pods.control_port}"]
    assert [fetch(port, site, user.username, user.password) for port in pods.proxy_ports] == [200, 200]
    asyncio.run(users.revoke(lease))
    assert [fetch(port, site, user.username, user.password) for port in pods.proxy_ports] == [407, 407]


def test_a_renewal_moves_the_end_on_every_pod(pods: Pods, site: int) -> None:
    users, _ = lease_users(pods)

    async def scenario() -> str:
        store, lease = await one_lease()
        issued, _ = await users.issue([lease], now=NOW + 58)  # a user that ends in 2 s
        renewed = await store.renew("l1", now=NOW + 58, ttl=300, cooldown=0)
        assert renewed is not None
        await users.extend(renewed, now=NOW + 58)
        return issued["l1"].password

    password = asyncio.run(scenario())
    asyncio.run(asyncio.sleep(3))
    assert [fetch(port, site, "lease-l1", password) for port in pods.proxy_ports] == [200, 200]


def test_a_lease_ended_by_the_services_clock_is_revoked_on_every_pod_and_forgotten(
    pods: Pods, site: int
) -> None:
    """The pods were told 60 s of their own clock; the service's clock says the lease has ended: its sweep
    revokes the user on both and forgets it (a follow round has nothing of it to add to a new pod)."""
    users, _ = lease_users(pods)

    async def scenario() -> str:
        store, lease = await one_lease()
        issued, _ = await users.issue([lease], now=NOW)
        assert users._issued == {"default/a": {"l1": users._issued["default/a"]["l1"]}}
        await users.sweep(now=NOW + 61, lookup=store.get_lease)
        return issued["l1"].password

    password = asyncio.run(scenario())
    assert [fetch(port, site, "lease-l1", password) for port in pods.proxy_ports] == [407, 407]
    assert users._issued == {}


@pytest.mark.parametrize(
    "resolved",
    [[], ["127.0.0.1", "127.0.0.3"]],
    ids=["no-address", "one-pod-not-listening"],
)
def test_a_lease_is_not_answered_unless_every_address_acknowledged(
    pods: Pods, site: int, resolved: list[str]
) -> None:
    users, _ = lease_users(pods, resolved=resolved)
    _, lease = asyncio.run(one_lease())
    issued, failed = asyncio.run(users.issue([lease], now=NOW))
    assert (issued, [f.lease_id for f in failed]) == ({}, ["l1"])


def test_a_push_without_the_proxys_password_is_refused_by_every_pod(pods: Pods, site: int) -> None:
    users, _ = lease_users(pods, password="not-its-password")
    _, lease = asyncio.run(one_lease())
    issued, failed = asyncio.run(users.issue([lease], now=NOW))
    assert (issued, len(failed)) == ({}, 1)


def test_targets_of_each_kind_of_channel() -> None:
    async def resolve(host: str, port: int) -> list[str]:
        return ["10.0.0.7", "fd00::7"]

    async def never(host: str, port: int) -> list[str]:
        await asyncio.sleep(60)
        return []

    assert asyncio.run(targets("/state/a.ctl", resolve=resolve, wait=1)) == ["/state/a.ctl"]
    assert asyncio.run(targets("tcp://pods:9178", resolve=resolve, wait=1)) == [
        "tcp://10.0.0.7:9178",
        "tcp://[fd00::7]:9178",
    ]
    assert asyncio.run(targets("tcp://pods:9178", resolve=never, wait=0.1)) == []  # bounded by the push
    assert asyncio.run(targets("tcp://pods", resolve=resolve, wait=1)) == []  # no port: nowhere to send
    assert asyncio.run(resolve_addresses("127.0.0.2", 9178)) == ["127.0.0.2"]
    assert "127.0.0.1" in asyncio.run(resolve_addresses("localhost", 9178))  # /etc/hosts, no DNS


class Resolver:
    """The headless Service's name as DNS answers it now: `addresses` changes as pods come and go."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = list(addresses)

    async def __call__(self, host: str, port: int) -> list[str]:
        return list(self.addresses)


def following(pods: Pods, resolver: Resolver) -> LeaseUsers:
    inventory = Inventory()
    control = f"tcp://{NAME}:{pods.control_port}"
    inventory.replace_all([endpoint("a", username="crawler", password=PASSWORD, control=control)])
    return LeaseUsers(inventory=inventory, enabled=True, resolve=resolver)


def test_a_pod_started_after_the_lease_gets_its_user_from_the_replica_that_issued_it(
    pods: Pods, site: int
) -> None:
    """A rollout: the lease was answered while only the old pod (127.0.0.1) was there; the new pod
    (127.0.0.2) knows no user until `follow` adds it there, by its digest. Fails on the code before, where
    a pod started after a lease never learnt its user (407 until the lease ended)."""
    resolver = Resolver(["127.0.0.1"])
    users = following(pods, resolver)
    old, new = pods.proxy_ports

    async def scenario() -> tuple[str, list[int], list[int]]:
        store, lease = await one_lease()
        issued, failed = await users.issue([lease], now=NOW)
        assert failed == []
        password = issued["l1"].password
        before = [fetch(port, site, "lease-l1", password) for port in (old, new)]
        resolver.addresses = list(POD_ADDRESSES)  # the new pod is published
        await users.follow(now=NOW + 5, lookup=store.get_lease)
        after = [fetch(port, site, "lease-l1", password) for port in (old, new)]
        await users.revoke(lease)
        return password, before, after

    password, before, after = asyncio.run(scenario())
    assert (before, after) == ([200, 407], [200, 200])
    assert [fetch(port, site, "lease-l1", password) for port in (old, new)] == [407, 407]


def test_a_lease_released_elsewhere_is_not_given_to_a_new_pod(pods: Pods, site: int) -> None:
    """`follow` reads each lease from the store: the end this replica saw at the lease (60 s) would still
    admit the user on the new pod after another replica's release."""
    resolver = Resolver(["127.0.0.1"])
    users = following(pods, resolver)

    async def scenario() -> str:
        store, lease = await one_lease()
        issued, _ = await users.issue([lease], now=NOW)
        assert await store.release("l1", now=NOW + 1, cooldown=0) is not None  # another replica's release
        resolver.addresses = list(POD_ADDRESSES)
        await users.follow(now=NOW + 5, lookup=store.get_lease)
        return issued["l1"].password

    password = asyncio.run(scenario())
    assert fetch(pods.proxy_ports[1], site, "lease-l1", password) == 407


def test_a_proxy_started_again_gets_its_live_users_back(tmp_path: Path, site: int) -> None:
    """The same address, a new process (a container restarted in its pod): `hello` names a new instance,
    so `follow` adds the users again; a process it already served is not sent them twice."""
    control_port = free_port()
    channel = f"tcp://127.0.0.1:{control_port}"
    egress = {"allow": [{"cidr": "127.0.0.1/32", "ports": [site]}]}
    sent: list[str] = []

    async def recording(target: str, request: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        sent.append(str(request["op"]))
        return await control.call(target, request, **kwargs)

    inventory = Inventory()
    inventory.replace_all([endpoint("a", username="crawler", password=PASSWORD, control=channel)])
    users = LeaseUsers(inventory=inventory, enabled=True, call=recording)

    async def issue_and_follow() -> tuple[MemoryStore, str]:
        store, lease = await one_lease()
        issued, _ = await users.issue([lease], now=NOW)
        await users.follow(now=NOW + 1, lookup=store.get_lease)  # the first look adds it once more
        return store, issued["l1"].password

    with run_proxy(tmp_path, control=channel, egress=egress, limits=NO_HOLD) as first:
        store, password = asyncio.run(issue_and_follow())
        assert fetch(first, site, "lease-l1", password) == 200
    with run_proxy(tmp_path, control=channel, egress=egress, limits=NO_HOLD) as second:
        assert fetch(second, site, "lease-l1", password) == 407  # a new process knows nobody
        sent.clear()
        asyncio.run(users.follow(now=NOW + 10, lookup=store.get_lease))
        assert sent == ["hello", "add"]
        assert fetch(second, site, "lease-l1", password) == 200
        sent.clear()
        asyncio.run(users.follow(now=NOW + 15, lookup=store.get_lease))
        assert sent == ["hello"]  # the same process: nothing to add
