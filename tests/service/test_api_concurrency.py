"""200 clients lease at once: nobody gets a proxy inside its cooldown for the same target (counted).

On Redis the requests are split between two replicas that share one redis-server, as in a real deployment.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx

from tests.service.conftest import ApiFactory, FakeClock, auth, healthy_inventory

PROXIES = 50
CLIENTS = ("crawler-a", "crawler-b")


async def _storm(urls: list[str], *, requests: int) -> list[tuple[str, httpx.Response]]:
    limits = httpx.Limits(max_connections=requests)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:

        async def one(i: int) -> tuple[str, httpx.Response]:
            who = CLIENTS[i % len(CLIENTS)]
            url = urls[i % len(urls)]
            body = {"target": "shop.example"}
            return who, await http.post(f"{url}/v1/leases", json=body, headers=auth(who))

        return await asyncio.gather(*(one(i) for i in range(requests)))


def test_200_concurrent_leases_never_break_a_cooldown(start_api: ApiFactory, store_kind: str) -> None:
    names = [f"p{i:02d}" for i in range(PROXIES)]
    clock = FakeClock()
    replicas = [start_api(inventory=healthy_inventory(names), clock=clock, cooldown_seconds=1000)]
    if store_kind != "memory":  # a second replica: its own inventory and store object, the same Redis state
        replicas.append(start_api(inventory=healthy_inventory(names), clock=clock, cooldown_seconds=1000))
    results = asyncio.run(_storm([r.url for r in replicas], requests=200))

    handed = Counter(
        (who, item["key"]) for who, r in results if r.status_code == 200 for item in r.json()["leases"]
    )
    refused = [r for _, r in results if r.status_code != 200]
    assert max(handed.values()) == 1, "a proxy was handed twice to one client for one target"
    for who in CLIENTS:
        assert sum(1 for (w, _) in handed if w == who) == PROXIES  # every proxy once, none twice
    assert len(refused) == 200 - 2 * PROXIES
    assert {r.status_code for r in refused} == {503}
    assert {r.headers["Retry-After"] for r in refused} == {"1000"}
