"""Leases, releases and reports through a live uvicorn, on the memory store and on a real redis-server."""

from __future__ import annotations

import random
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from service.api import create_app
from service.auth import TokenAuthenticator
from service.discovery.service import DiscoveryService
from service.discovery.store import Acquired, AcquireRequest, LeaseRecord, Store
from service.inventory import Health, HealthState, Inventory
from service.settings import DiscoverySettings
from tests.service.conftest import (
    Api,
    ApiFactory,
    FakeClock,
    StoreFactory,
    UvicornThread,
    auth,
    healthy_inventory,
)

LEASE = "/v1/leases"


def lease(client, who: str = "crawler-a", **body):  # type: ignore[no-untyped-def]
    return client.post(LEASE, json=body, headers=auth(who))


def keys(response) -> list[str]:  # type: ignore[no-untyped-def]
    return [item["key"] for item in response.json()["leases"]]


def test_lease_returns_a_ready_to_use_proxy(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a"]), lease_ttl_seconds=45)
    with api.client() as client:
        response = lease(client, target="Example.COM")
    assert response.status_code == 200, response.text
    body = response.json()
    item = body["leases"][0]
    assert body["target"] == "example.com"
    assert item["url"] == "http://user:p%40ss%20word@127.0.0.1:3128"
    assert (item["host"], item["port"], item["protocol"]) == ("127.0.0.1", 3128, "http")
    assert (item["username"], item["password"], item["key"]) == ("user", "p@ss word", "default/a")
    assert item["leaseId"]
    assert item["egressIp"] == "127.0.0.1"
    assert item["expiresAt"].startswith("2027-01-15T08:00:45")  # FakeClock start + ttl


def test_least_recently_used_first_and_distinct_in_one_batch(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a", "b", "c"]), cooldown_seconds=0, lease_ttl_seconds=1)
    with api.client() as client:
        first = keys(lease(client, count=2, target="one.example"))
        api.clock.advance(1)
        second = keys(lease(client, count=2, target="two.example"))
    assert len(set(first)) == 2
    assert second[0] == ({"default/a", "default/b", "default/c"} - set(first)).pop()  # the one never used
    assert second[1] == first[0]  # then the oldest hand-out


def test_cooldown_per_client_and_target_with_retry_after(start_api: ApiFactory) -> None:
    clock = FakeClock()
    api = start_api(
        inventory=healthy_inventory(["a", "b"]), clock=clock, cooldown_seconds=100, lease_ttl_seconds=30
    )
    with api.client() as client:
        assert len(keys(lease(client, count=5, target="shop.example"))) == 2  # at most count, all it has
        refused = lease(client, target="shop.example")
        assert refused.status_code == 503
        assert refused.json()["error"] == "all_cooling_down"
        assert refused.headers["Retry-After"] == "100"
        assert lease(client, "crawler-b", target="shop.example").status_code == 200  # another client
        assert lease(client, target="news.example").status_code == 200  # another target
        clock.advance(60.5)
        assert lease(client, target="shop.example").headers["Retry-After"] == "40"  # ceil(39.5)
        clock.advance(39.5)
        assert lease(client, target="shop.example").status_code == 200


def test_a_held_lease_blocks_until_released_then_cooldown_applies(start_api: ApiFactory) -> None:
    clock = FakeClock()
    api = start_api(
        inventory=healthy_inventory(["a"]), clock=clock, cooldown_seconds=10, lease_ttl_seconds=300
    )
    with api.client() as client:
        lease_id = lease(client, target="t.example").json()["leases"][0]["leaseId"]
        clock.advance(20)
        held = lease(client, target="t.example")
        assert held.status_code == 503
        assert held.headers["Retry-After"] == "1"  # its own lease: released now, it is eligible at once
        assert "without a release, the first is free in 280 s" in held.json()["detail"]
        assert client.delete(f"{LEASE}/{lease_id}", headers=auth("crawler-a")).status_code == 204
        assert lease(client, target="t.example").status_code == 200  # hand-out + 10 s is past


def test_release_errors(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a"]))
    with api.client() as client:
        lease_id = lease(client).json()["leases"][0]["leaseId"]
        other = client.delete(f"{LEASE}/{lease_id}", headers=auth("crawler-b"))
        assert other.status_code == 404  # another client's lease is not theirs to end
        assert client.delete(f"{LEASE}/{lease_id}", headers=auth("crawler-a")).status_code == 204
        again = client.delete(f"{LEASE}/{lease_id}", headers=auth("crawler-a"))
        assert again.status_code == 404
        assert again.json()["error"] == "lease_not_found"
        assert client.delete(f"{LEASE}/nope", headers=auth("crawler-a")).status_code == 404


def test_a_ban_for_one_target_leaves_the_proxy_usable_for_others(start_api: ApiFactory) -> None:
    clock = FakeClock()
    api = start_api(inventory=healthy_inventory(["a"]), clock=clock, cooldown_seconds=0, lease_ttl_seconds=1)
    with api.client() as client:
        lease_id = lease(client, target="shop.example").json()["leases"][0]["leaseId"]
        report = client.post(
            "/v1/reports",
            json={"lease": lease_id, "outcome": "banned", "statusCode": 403},
            headers=auth("crawler-a"),
        )
        assert report.status_code == 200, report.text
        assert report.json()["strikes"] == 1
        clock.advance(1)
        assert lease(client, target="shop.example").status_code == 503
        assert lease(client, "crawler-b", target="shop.example").status_code == 503  # per target, not client
        assert keys(lease(client, target="news.example")) == ["default/a"]
        detail = client.get("/v1/proxies/default/a", headers=auth("crawler-a")).json()
        assert [p["target"] for p in detail["penalties"]] == ["shop.example"]
        ok = {"lease": lease_id, "outcome": "ok"}
        refused = client.post("/v1/reports", json=ok, headers=auth("reporter"))  # not its lease
        assert (refused.status_code, refused.json()["error"]) == (404, "lease_not_found")
        good = client.post("/v1/reports", json=ok, headers=auth("crawler-a"))
        assert good.json()["effect"] == "penalty_runs"  # a good report never lifts a running ban
        assert lease(client, target="shop.example").status_code == 503
        clock.advance(300)  # penalty_base_seconds: the longest a first ban lasts
        assert keys(lease(client, target="shop.example")) == ["default/a"]


class ScriptedRandom(random.Random):
    """The discovery's random source, answering `random()` with the draws a test chose, in order."""

    def __init__(self, draws: list[float]) -> None:
        super().__init__(0)
        self.draws = list(draws)

    def random(self) -> float:
        return self.draws.pop(0)


@pytest.fixture
def serve_with_rng(tokens_file: Path, store_factory: StoreFactory) -> Iterator[Callable[..., Api]]:
    """Like `start_api`, with the random source injected: `serve_with_rng(rng, inventory=..., **settings)`."""
    running: list[UvicornThread] = []

    def start(rng: random.Random, *, inventory: Inventory, **settings: Any) -> Api:
        clock, store, registry = FakeClock(), store_factory(), CollectorRegistry()
        discovery = DiscoveryService(
            inventory=inventory, store=store, settings=DiscoverySettings(**settings), clock=clock, rng=rng
        )
        app = create_app(
            inventory=inventory,
            discovery=discovery,
            authenticator=TokenAuthenticator(path=tokens_file),
            registry=registry,
            lifespan=_closing(store),
        )
        running.append(UvicornThread(app).start())
        return Api(running[-1], inventory, discovery, clock, registry)

    yield start
    for server in running:
        server.stop()


def _closing(store: Store) -> Any:
    @asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        yield
        await store.close()

    return lifespan


def test_ban_penalty_is_exactly_full_jitter_and_its_bound_grows(serve_with_rng: Callable[..., Api]) -> None:
    """penalisedUntil = now + draw * min(cap, base * 2**(strikes - 1)), strikes 1, 2, 3, ...; ok resets."""
    rng = ScriptedRandom([0.5, 0.25, 0.9, 0.999, 0.4])
    api = serve_with_rng(
        rng,
        inventory=healthy_inventory(["a"]),
        penalty_base_seconds=300,
        penalty_cap_seconds=1000,
    )
    clock = api.clock
    expected = [(1, 0.5 * 300), (2, 0.25 * 600), (3, 0.9 * 1000), (4, 0.999 * 1000)]

    def leased(client: httpx.Client) -> str:
        answer = lease(client, target="shop.example")
        assert keys(answer) == ["default/a"]
        return str(answer.json()["leases"][0]["leaseId"])

    with api.client() as client:
        for strikes, delay in expected:
            ban = {"lease": leased(client), "outcome": "banned"}
            body = client.post("/v1/reports", json=ban, headers=auth("crawler-a")).json()
            assert body["strikes"] == strikes
            until = datetime.fromisoformat(body["penalisedUntil"]).timestamp()
            assert until == pytest.approx(clock.now + delay, abs=1e-3), (strikes, until - clock.now)
            clock.advance(2000)  # let it expire so the next ban stands on its own
        ban = {"lease": leased(client), "outcome": "banned"}  # the last penalty ran out
        ok = {"lease": ban["lease"], "outcome": "ok"}
        assert (
            client.post("/v1/reports", json=ok, headers=auth("crawler-a")).json()["effect"] == "strikes_reset"
        )
        body = client.post("/v1/reports", json=ban, headers=auth("crawler-a")).json()
    assert body["strikes"] == 1  # the good report reset the count, and the bound with it
    until = datetime.fromisoformat(body["penalisedUntil"]).timestamp()
    assert until == pytest.approx(clock.now + 0.4 * 300, abs=1e-3)
    assert rng.draws == []  # one draw per ban, none elsewhere


def test_error_reports_count_towards_health_once_two_clients_agree(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a"]))
    with api.client() as client:
        body = {"proxy": "default/a", "target": "x.example", "outcome": "error", "statusCode": 502}
        for who in ("crawler-a", "crawler-b"):  # error_quorum: 2 distinct clients by default
            assert keys(lease(client, who, target="x.example")) == ["default/a"]
            assert client.post("/v1/reports", json=body, headers=auth(who)).status_code == 200
    assert api.errors_reported == ["default/a", "default/a"]


def test_with_a_quorum_of_one_a_client_s_error_counts_once(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a"]), error_quorum=1)
    with api.client() as client:
        body = {"proxy": "default/a", "target": "x.example", "outcome": "error", "statusCode": 502}
        assert keys(lease(client, target="x.example")) == ["default/a"]
        for _ in range(3):
            assert client.post("/v1/reports", json=body, headers=auth("crawler-a")).status_code == 200
    assert api.errors_reported == ["default/a"]  # once per error_window_seconds


def test_report_errors(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a"]))
    with api.client() as client:
        unknown = client.post(
            "/v1/reports", json={"proxy": "default/zz", "outcome": "error"}, headers=auth("reporter")
        )
        assert (unknown.status_code, unknown.json()["error"]) == (404, "proxy_not_found")
        no_lease = client.post(
            "/v1/reports", json={"lease": "nope", "outcome": "ok"}, headers=auth("reporter")
        )
        assert (no_lease.status_code, no_lease.json()["error"]) == (404, "lease_not_found")
        both = client.post(
            "/v1/reports",
            json={"lease": "x", "proxy": "default/a", "outcome": "ok"},
            headers=auth("reporter"),
        )
        assert both.status_code == 422
        bad = client.post(
            "/v1/reports", json={"proxy": "default/a", "outcome": "meh"}, headers=auth("reporter")
        )
        assert bad.status_code == 422
        assert bad.json()["detail"][0]["field"] == "body.outcome"


def test_sticky_session_keeps_its_proxy_and_rebinds_when_it_goes(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a", "b"]), cooldown_seconds=60, session_idle_seconds=600)
    with api.client() as client:
        first = lease(client, target="t.example", session="s1").json()
        bound = first["leases"][0]["key"]
        assert first["rebound"] is False
        again = lease(client, target="t.example", session="s1").json()  # sticky beats the cooldown
        assert (again["leases"][0]["key"], again["rebound"]) == (bound, False)
        api.inventory.set_health(bound, Health(state=HealthState.unhealthy))
        strict = lease(client, target="t.example", session="s1", strict=True)
        assert (strict.status_code, strict.json()["error"]) == (409, "session_lost")
        moved = lease(client, target="t.example", session="s1").json()
        assert moved["rebound"] is True
        assert moved["previousProxy"] == bound
        assert moved["leases"][0]["key"] != bound
        api.clock.advance(601)  # idle expiry: a fresh binding, not a re-bind
        fresh = lease(client, target="t.example", session="s1").json()
        assert fresh["rebound"] is False


class RecordingStore:
    """A real store that records, in order, what each acquire decided and each release (instrumentation)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.events: list[str] = []
        self.refused = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def acquire(self, request: AcquireRequest, *, now: float) -> Acquired:
        acquired = await self.inner.acquire(request, now=now)
        self.events.append("granted" if acquired.leases else "refused")
        if not acquired.leases:
            self.refused.set()
        return acquired

    async def release(self, lease_id: str, *, now: float, cooldown: float) -> LeaseRecord | None:
        # Recorded as the release starts: the waiter, once the proxy is free in the store, may be granted
        # it before this call's own await returns (seen with Redis under load).
        self.events.append("released")
        return await self.inner.release(lease_id, now=now, cooldown=cooldown)


def test_wait_is_woken_by_a_release(
    start_api: ApiFactory, store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No periodic re-check may rescue a waiter that the release failed to wake: it would sleep out its wait.
    monkeypatch.setattr("service.discovery.service.POLL_SECONDS", 60.0)
    store = RecordingStore(store_factory())
    api = start_api(
        inventory=healthy_inventory(["a"]), store=store, cooldown_seconds=0, lease_ttl_seconds=300
    )
    result = {}
    with api.client() as client:
        lease_id = lease(client, target="t.example").json()["leases"][0]["leaseId"]

        def waiting() -> None:
            with api.client() as other:
                result["response"] = lease(other, target="t.example", wait=20)

        thread = threading.Thread(target=waiting, name="waiter")
        thread.start()
        # The waiter's attempt was refused (the only proxy is held), so it waits; it read the wake-up
        # generation before that attempt, so the release below cannot slip in unnoticed.
        assert store.refused.wait(timeout=10), "the waiting lease never tried"
        assert client.delete(f"{LEASE}/{lease_id}", headers=auth("crawler-a")).status_code == 204
        thread.join(timeout=10)  # far below the 20 s wait and the 60 s re-check
        woke = not thread.is_alive()
        thread.join()
    assert woke, "the waiter did not wake on the release"
    # The waiter may also try while the release is under way (a wake-up from elsewhere): refused again.
    first, *middle, last = store.events
    assert (first, last) == ("granted", "granted"), store.events
    assert set(middle) == {"refused", "released"}, store.events
    assert result["response"].status_code == 200
    assert keys(result["response"]) == ["default/a"]


def test_wait_ends_in_503_when_nothing_frees(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a"]), cooldown_seconds=50)
    with api.client() as client:
        assert lease(client, target="t.example").status_code == 200
        refused = lease(client, target="t.example", wait=0.2)
    assert refused.status_code == 503
    assert refused.headers["Retry-After"] == "50"  # the cooldown, counting its own release
    assert "free in 60 s" in refused.json()["detail"]  # without one: held for the default ttl of 60 s


def test_no_healthy_candidate_is_503_with_the_probe_interval(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a"]))
    with api.client() as client:
        refused = lease(client, pool="elsewhere")
    assert refused.status_code == 503
    assert refused.json()["error"] == "no_candidates"
    assert refused.headers["Retry-After"] == "10"


def test_filters_select_by_pool_provider_and_labels(start_api: ApiFactory) -> None:
    inventory = healthy_inventory(["a"], pool="eu", labels={"tier": "gold"})
    for key, pool in (("b", "us"), ("c", "eu")):
        inventory.upsert(healthy_inventory([key], pool=pool).get(f"default/{key}"))  # type: ignore[arg-type]
        inventory.set_health(f"default/{key}", Health(state=HealthState.healthy))
    api = start_api(inventory=inventory, cooldown_seconds=0)
    with api.client() as client:
        assert sorted(keys(lease(client, count=5, pool="eu", target="1.example"))) == [
            "default/a",
            "default/c",
        ]
        assert keys(lease(client, count=5, labels={"tier": "gold"}, target="2.example")) == ["default/a"]
        assert lease(client, provider="gcp-eu", target="3.example").status_code == 503


def test_limits_are_lowered_not_refused_and_the_answer_says_so(start_api: ApiFactory) -> None:
    api = start_api(
        inventory=healthy_inventory(["a", "b", "c"]),
        max_count=2,
        lease_ttl_max_seconds=100,
        max_wait_seconds=5,
    )
    with api.client() as client:
        body = lease(client, count=3000, ttl=99999, wait=1e9).json()
        within = lease(client, target="other.example", count=1, ttl=50, wait=1).json()
    assert len(body["leases"]) == 2
    expires = datetime.fromisoformat(body["leases"][0]["expiresAt"]).timestamp()
    assert expires == api.clock.now + 100
    assert body["lowered"] == {"count": 2, "ttl": 100, "wait": 5}
    assert within["lowered"] == {}


def test_lease_validation_errors_name_the_field(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a"]))
    cases = [
        ({"target": "https://example.com/x"}, "body.target"),
        ({"count": 0}, "body.count"),
        ({"count": 1.5}, "body.count"),
        ({"ttl": 0}, "body.ttl"),
        ({"ttl": -1}, "body.ttl"),
        ({"wait": -1}, "body.wait"),
        ({"colour": "red"}, "body.colour"),
        ({"session": "s", "count": 2}, "body"),
        ({"strict": True}, "body"),
    ]
    with api.client() as client:
        for body, where in cases:
            response = lease(client, **body)
            assert response.status_code == 422, body
            error = response.json()
            assert error["error"] == "invalid_request"
            assert error["detail"][0]["field"] == where, (body, error)
            assert error["requestId"]
        not_json = client.post(
            LEASE, content=b"{", headers={**auth("crawler-a"), "content-type": "application/json"}
        )
        assert not_json.status_code == 422
