"""A client that ignores its refusals is held, not served at once: the cost of its flood falls on itself.

A live uvicorn (memory store). Before: every refused request was answered at once, so a client that ignored
`Retry-After` on many connections took the event loop from the other clients (docs/operations.md, "Two
hostile clients": 0.58 of the crawlers' lease rate beside two such clients on 16 connections each).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from service.api.pacing import SPACING
from tests.service.conftest import ApiFactory, auth, healthy_inventory

pytestmark = pytest.mark.parametrize("store_kind", ["memory"])  # pacing is the server's, not a store's


def _timed(client: httpx.Client, who: str, body: dict[str, object], path: str = "/v1/leases") -> float:
    started = time.monotonic()
    client.post(path, json=body, headers=auth(who))
    return time.monotonic() - started


def test_past_its_lease_rate_a_client_is_held_until_retry_after(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a", "b"]), lease_rate=1.0, lease_burst=1)
    with api.client() as client:
        assert client.post("/v1/leases", json={"target": "x.example"}, headers=auth("crawler-a")).is_success
        refused = client.post("/v1/leases", json={"target": "y.example"}, headers=auth("crawler-a"))
        assert (refused.status_code, refused.headers["Retry-After"]) == (429, "1")
        assert _timed(client, "crawler-a", {"target": "z.example"}) >= 0.8  # it came back at once: held
        assert _timed(client, "crawler-b", {"target": "z.example"}) < 0.5  # another client is not


def test_a_client_refused_again_and_again_is_answered_one_spacing_apart(start_api: ApiFactory) -> None:
    """Eight connections of bad reports: 24 refusals take at least 23 spacings, the first refused at once."""
    api = start_api(inventory=healthy_inventory(["a"]))
    bad = {"proxy": "default/a", "outcome": "banned"}  # 422 lease_required
    with api.client() as first:
        assert first.post("/v1/reports", json=bad, headers=auth("crawler-a")).status_code == 422
    started = time.monotonic()

    def flood(_: int) -> None:
        with api.client() as client:
            for _ in range(3):
                assert client.post("/v1/reports", json=bad, headers=auth("crawler-a")).status_code == 422

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(flood, range(8)))
    assert time.monotonic() - started >= 23 * SPACING
    with api.client() as client:
        ok = client.post("/v1/leases", json={"target": "x.example"}, headers=auth("crawler-b"))
        assert ok.is_success
