"""Lease-scoped credentials on `local` proxies of a shared listener (`processModel: shared`), through the
real API and real listener processes: the lease's user goes over the listener's one socket naming its
proxy, works on that proxy only (every other port of the same process refuses it), and ends with the
release."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.inventory import Health, HealthState, Inventory
from stacks.programs import local_process as proc
from stacks.programs.local_shared import LocalSharedProxyProvider
from tests.ports import free_port
from tests.service.conftest import ApiFactory, endpoint
from tests.service.site import Site
from tests.service.test_lease_scoped_credentials import STATIC, call, fetch, lease, static_url


@pytest.fixture
def site() -> Iterator[Site]:
    with Site() as running:
        yield running


@pytest.fixture
def shared_inventory(tmp_path: Path, site: Site) -> Iterator[Inventory]:
    """Two proxies of one shared listener, healthy in an inventory, with the channels `create` output."""
    provider, created = LocalSharedProxyProvider(), []
    allowed = {"allow": [{"cidr": "127.0.0.1/32", "ports": [int(site.base.rsplit(":", 1)[1])]}]}
    endpoints = []
    for name in ("s0", "s1"):
        port = free_port()
        props = {"key": f"default/{name}", "stem": f"default_{name}", "state_dir": str(tmp_path / "st")}
        props |= {"bind_address": "127.0.0.1", "port": port, "protocol": "http", "egress": allowed}
        props |= {"username": STATIC[0], "password": STATIC[1], "process_model": "shared", "entry": "e"}
        result = provider.create(props)
        created.append(result)
        assert result.outs is not None
        channel = result.outs["control"]
        endpoints.append(endpoint(name, port=port, username=STATIC[0], password=STATIC[1], control=channel))
    assert len({result.id for result in created}) == 1  # one process serves both
    inventory = Inventory()
    inventory.replace_all(endpoints)
    for item in endpoints:
        inventory.set_health(item.key, Health(state=HealthState.healthy, egress_ip="127.0.0.1"))
    yield inventory
    for result in created:
        provider.delete(result.id, result.outs or {})
    ref = proc.ProcessRef.from_instance_id(created[0].id)
    assert ref is not None
    assert not proc.is_running(ref)  # the last delete stopped it


@pytest.mark.parametrize("store_kind", ["memory"])
def test_a_lease_user_of_a_shared_listener_works_on_its_proxy_only_until_released(
    start_api: ApiFactory, shared_inventory: Inventory, site: Site
) -> None:
    api = start_api(inventory=shared_inventory, cooldown_seconds=0)
    leased = lease(api)[0]
    assert leased["credentialsScope"] == "lease"
    assert fetch(leased["url"], site) == 200
    other = "s1" if leased["key"] == "default/s0" else "s0"
    other_port = shared_inventory.get(f"default/{other}").port  # type: ignore[union-attr]
    elsewhere = leased["url"].replace(f":{leased['port']}", f":{other_port}")
    assert fetch(elsewhere, site) == 407  # the same process, another proxy: not its user
    assert call(api, "DELETE", f"/v1/leases/{leased['leaseId']}").status_code == 204
    assert fetch(leased["url"], site) == 407
    assert fetch(static_url(leased), site) == 200
