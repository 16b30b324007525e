"""Lease-scoped credentials through the real API (uvicorn) and real `local` proxies (the provider's create).

A lease on a proxy with a control channel answers a user of its own: the proxy works with it, refuses it
after the release (also one made on another replica), after the lease's end (by the proxy's own clock,
without any release, and by the service's sweep), and never sees the proxy's static credentials leave the
service. Two leases get two users; a renewal keeps a user alive past its first end; a proxy without a
channel (or the setting off) answers as before, and says so. Each test fails on the code before, where
every lease carried the proxy's own credentials, valid for ever.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.inventory import Health, HealthState, Inventory
from stacks.programs.local import LocalProxyProvider
from tests.ports import free_port
from tests.service.conftest import Api, ApiFactory, auth, endpoint
from tests.service.site import Site

STATIC = ("static-user", "Static-Pass-1234")
memory_only = pytest.mark.parametrize("store_kind", ["memory"])


@pytest.fixture
def site() -> Iterator[Site]:
    with Site() as running:
        yield running


Make = Callable[..., Inventory]


@pytest.fixture
def proxies(tmp_path: Path, site: Site) -> Iterator[Make]:
    """`make(n, control=True)`: n real forward proxies allowing the site, healthy in a new inventory;
    `control=False` leaves their channel out of the endpoints (as for 3proxy, tinyproxy, dante)."""
    provider, created = LocalProxyProvider(), []
    allowed = {"allow": [{"cidr": "127.0.0.1/32", "ports": [int(site.base.rsplit(":", 1)[1])]}]}

    def make(count: int, *, control: bool = True) -> Inventory:
        endpoints = []
        for i in range(count):
            port = free_port()
            props = {"state_dir": str(tmp_path), "stem": f"p{i}", "bind_address": "127.0.0.1", "port": port}
            props |= {"protocol": "http", "username": STATIC[0], "password": STATIC[1], "egress": allowed}
            result = provider.create(props)
            created.append(result)
            channel = result.outs["control"] if control else None
            endpoints.append(
                endpoint(f"p{i}", port=port, username=STATIC[0], password=STATIC[1], control=channel)
            )
        inventory = Inventory()
        inventory.replace_all(endpoints)
        for item in endpoints:
            inventory.set_health(item.key, Health(state=HealthState.healthy, egress_ip="127.0.0.1"))
        return inventory

    yield make
    for result in created:
        provider.delete(result.id, result.outs or {})


def lease(api: Api, client: str = "crawler-a", **body: Any) -> list[dict[str, Any]]:
    with api.client() as http:
        answer = http.post("/v1/leases", json=body, headers=auth(client))
    assert answer.status_code == 200, answer.text
    leases: list[dict[str, Any]] = answer.json()["leases"]
    return leases


def call(api: Api, method: str, path: str, client: str = "crawler-a", **kwargs: Any) -> httpx.Response:
    with api.client() as http:
        return http.request(method, path, headers=auth(client), **kwargs)


def fetch(proxy_url: str, site: Site) -> int:
    with httpx.Client(proxy=proxy_url, timeout=10) as client:
        return client.get(site.url("/ok")).status_code


def refused(proxy_url: str, site: Site) -> bool:
    """Whether the proxy turns the user away (407). A request that is mid-flight when the user ends is cut
    (the user's connections end with it, by design): that counts as "not yet", and the next try asks again."""
    try:
        return fetch(proxy_url, site) == 407
    except httpx.TransportError:
        return False


def static_url(leased: dict[str, Any]) -> str:
    return f"http://{STATIC[0]}:{STATIC[1]}@{leased['host']}:{leased['port']}"


def until(condition: Callable[[], bool], *, within: float = 20.0) -> bool:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@memory_only
def test_a_lease_carries_its_own_user_never_the_proxys(
    start_api: ApiFactory, proxies: Make, site: Site
) -> None:
    api = start_api(inventory=proxies(1))
    with api.client() as http:
        answer = http.post("/v1/leases", json={}, headers=auth("crawler-a"))
    leased = answer.json()["leases"][0]
    assert leased["credentialsScope"] == "lease"
    assert leased["username"] == f"lease-{leased['leaseId']}"
    assert STATIC[0] not in answer.text
    assert STATIC[1] not in answer.text
    assert leased["url"] == f"http://{leased['username']}:{leased['password']}@127.0.0.1:{leased['port']}"
    assert fetch(leased["url"], site) == 200


@memory_only
def test_after_release_the_lease_credentials_get_407(
    start_api: ApiFactory, proxies: Make, site: Site
) -> None:
    api = start_api(inventory=proxies(1))
    leased = lease(api)[0]
    assert fetch(leased["url"], site) == 200
    assert call(api, "DELETE", f"/v1/leases/{leased['leaseId']}").status_code == 204
    assert fetch(leased["url"], site) == 407
    assert fetch(static_url(leased), site) == 200  # the prober's credentials are untouched


@memory_only
def test_the_proxy_ends_a_lease_user_at_expiry_without_a_release_and_a_renewal_moves_it(
    start_api: ApiFactory, proxies: Make, site: Site
) -> None:
    """The service's clock stands still here: only the proxy's own end can turn the first user away."""
    api = start_api(inventory=proxies(2), cooldown_seconds=0)
    short, renewed = lease(api, count=2, ttl=3)
    assert call(api, "POST", f"/v1/leases/{renewed['leaseId']}/renew", json={"ttl": 300}).status_code == 200
    assert fetch(short["url"], site) == 200
    assert until(lambda: refused(short["url"], site))
    assert fetch(renewed["url"], site) == 200  # its first end (3 s) has passed too


@memory_only
def test_two_leases_get_two_users_and_one_release_ends_only_its_own(
    start_api: ApiFactory, proxies: Make, site: Site
) -> None:
    api = start_api(inventory=proxies(1))
    first, second = lease(api, "crawler-a")[0], lease(api, "crawler-b")[0]  # the same proxy, two clients
    assert first["key"] == second["key"]
    assert first["username"] != second["username"]
    assert first["password"] != second["password"]
    assert call(api, "DELETE", f"/v1/leases/{first['leaseId']}").status_code == 204
    assert (fetch(first["url"], site), fetch(second["url"], site)) == (407, 200)


@pytest.mark.parametrize("store_kind", ["redis"])
def test_a_renewal_and_a_release_on_another_replica_reach_the_proxy(
    start_api: ApiFactory, proxies: Make, site: Site
) -> None:
    inventory = proxies(2)
    leasing, other = start_api(inventory=inventory), start_api(inventory=inventory)
    short, renewed = lease(leasing, count=2, ttl=3)
    path = f"/v1/leases/{renewed['leaseId']}"
    assert call(other, "POST", f"{path}/renew", json={"ttl": 300}).status_code == 200
    assert until(lambda: refused(short["url"], site))  # past the first end of both
    assert fetch(renewed["url"], site) == 200
    assert call(other, "DELETE", path).status_code == 204
    assert fetch(renewed["url"], site) == 407


@memory_only
def test_a_proxy_that_cannot_take_lease_users_answers_its_own_credentials_and_says_so(
    start_api: ApiFactory, proxies: Make, site: Site
) -> None:
    api = start_api(inventory=proxies(1, control=False))
    leased = lease(api)[0]
    assert leased["credentialsScope"] == "proxy"
    assert (leased["username"], leased["password"]) == STATIC
    assert fetch(leased["url"], site) == 200


@memory_only
def test_the_setting_off_answers_the_proxys_credentials(
    start_api: ApiFactory, proxies: Make, site: Site
) -> None:
    api = start_api(inventory=proxies(1), lease_scoped_credentials=False)
    leased = lease(api)[0]
    assert (leased["credentialsScope"], leased["username"]) == ("proxy", STATIC[0])
    assert fetch(leased["url"], site) == 200


@memory_only
def test_a_proxy_whose_channel_is_gone_is_not_answered(
    start_api: ApiFactory, proxies: Make, tmp_path: Path
) -> None:
    inventory = proxies(1)
    Path(str(inventory.endpoints()[0].control)).unlink()  # the push cannot reach it
    api = start_api(inventory=inventory)
    answer = call(api, "POST", "/v1/leases", json={})
    assert answer.status_code == 503
    assert answer.json()["error"] == "lease_user_failed"
    assert STATIC[1] not in answer.text
