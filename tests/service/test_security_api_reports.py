"""Security: reports cannot be turned against other clients (a live uvicorn; memory store and real Redis).

Only a client that holds, or recently held, a lease on a proxy may report on it; a good report never lifts
another's running ban; one client's `error` reports do not move health until other clients agree; each
client's reports are rate-limited.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from service.discovery.memory import MemoryStore
from service.discovery.report_summary import ReportEntry
from tests.service.conftest import ApiFactory, FakeClock, StoreFactory, auth, healthy_inventory

TARGET = "shop.example"


@pytest.fixture(params=["memory", "redis"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _lease(client: httpx.Client, who: str, **body: Any) -> dict[str, Any]:
    answer = client.post("/v1/leases", json={"target": TARGET, **body}, headers=auth(who))
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["leases"][0])


def _report(client: httpx.Client, who: str, **body: Any) -> httpx.Response:
    return client.post("/v1/reports", json=body, headers=auth(who))


def _refused(answer: httpx.Response, status: int, reason: str) -> None:
    assert (answer.status_code, answer.json()["error"]) == (status, reason), answer.text


def test_a_client_that_never_leased_a_proxy_cannot_ban_it(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a"]))
    with api.client() as client:
        ban = {"proxy": "default/a", "target": TARGET, "outcome": "banned"}
        _refused(_report(client, "crawler-b", **ban), 422, "lease_required")  # a ban names its lease
        _refused(_report(client, "reporter", **ban), 422, "lease_required")
        error = {"proxy": "default/a", "outcome": "error"}
        _refused(_report(client, "reporter", **error), 403, "not_a_leaseholder")  # report scope alone
        _refused(_report(client, "crawler-b", **error), 403, "not_a_leaseholder")
        assert _lease(client, "crawler-a")["key"] == "default/a"  # not banned, not unhealthy
    assert api.errors_reported == []


def test_nobody_reports_through_another_client_s_lease(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a"]))
    with api.client() as client:
        lease_id = _lease(client, "crawler-a")["leaseId"]
        _refused(_report(client, "crawler-b", lease=lease_id, outcome="banned"), 404, "lease_not_found")
        assert _report(client, "crawler-a", lease=lease_id, outcome="banned").json()["effect"] == "penalised"


def test_a_leaseholder_may_report_until_the_window_closes(start_api: ApiFactory) -> None:
    clock = FakeClock()
    api = start_api(inventory=healthy_inventory(["a"]), clock=clock, report_window_seconds=300)
    with api.client() as client:
        lease = _lease(client, "crawler-a", ttl=60)
        assert client.delete(f"/v1/leases/{lease['leaseId']}", headers=auth("crawler-a")).status_code == 204
        clock.advance(299)  # released at once: the window runs from then (by lease) or the lease's end
        by_lease = _report(client, "crawler-a", lease=lease["leaseId"], outcome="ok")
        assert by_lease.status_code == 200, by_lease.text
        by_proxy = _report(client, "crawler-a", proxy="default/a", outcome="error")
        assert by_proxy.status_code == 200, by_proxy.text
        clock.advance(62)
        _refused(
            _report(client, "crawler-a", lease=lease["leaseId"], outcome="banned"), 403, "not_a_leaseholder"
        )
        _refused(_report(client, "crawler-a", proxy="default/a", outcome="error"), 403, "not_a_leaseholder")


def test_a_good_report_does_not_lift_another_client_s_ban(start_api: ApiFactory) -> None:
    clock = FakeClock()
    api = start_api(inventory=healthy_inventory(["a"]), clock=clock, penalty_base_seconds=300)
    with api.client() as client:
        first_a = _lease(client, "crawler-a")
        first_b = _lease(client, "crawler-b")  # both hold the one proxy (cooldowns are per client)
        banned = _report(client, "crawler-a", lease=first_a["leaseId"], outcome="banned").json()
        assert banned["effect"] == "penalised"
        ok = _report(client, "crawler-b", lease=first_b["leaseId"], outcome="ok").json()
        assert ok["effect"] == "penalty_runs"
        clock.advance(61)  # both leases over, the cooldown too: only the ban can keep b from it
        again = client.post("/v1/leases", json={"target": TARGET}, headers=auth("crawler-b"))
        _refused(again, 503, "all_cooling_down")
        detail = client.get("/v1/proxies/default/a", headers=auth("crawler-b")).json()
        assert [p["target"] for p in detail["penalties"]] == [TARGET]


def test_one_client_s_errors_do_not_move_health_until_another_agrees(start_api: ApiFactory) -> None:
    clock = FakeClock()
    api = start_api(inventory=healthy_inventory(["a"]), clock=clock, cooldown_seconds=0)
    with api.client() as client:
        lease_a = _lease(client, "crawler-a")
        for _ in range(5):
            answer = _report(client, "crawler-a", lease=lease_a["leaseId"], outcome="error")
            assert answer.json()["effect"] == "awaiting_quorum", answer.text
        assert api.errors_reported == []  # before: five failures, the proxy unhealthy for everyone
        lease_b = _lease(client, "crawler-b")
        assert (
            _report(client, "crawler-b", lease=lease_b["leaseId"], outcome="error").json()["effect"]
            == "counted"
        )
        assert api.errors_reported == ["default/a", "default/a"]  # both clients, once each
        assert _report(client, "crawler-a", lease=lease_a["leaseId"], outcome="error").json()["effect"] == (
            "already_counted"
        )
        assert api.errors_reported == ["default/a", "default/a"]


def test_reports_are_rate_limited_per_client_with_retry_after(start_api: ApiFactory) -> None:
    clock = FakeClock()  # starts on a whole minute
    api = start_api(
        inventory=healthy_inventory(["a"]), clock=clock, report_rate_limit=3, report_rate_period_seconds=60
    )
    with api.client() as client:
        lease_a, lease_b = _lease(client, "crawler-a"), _lease(client, "crawler-b")
        for _ in range(3):
            assert _report(client, "crawler-a", lease=lease_a["leaseId"], outcome="ok").status_code == 200
        clock.advance(20)
        over = _report(client, "crawler-a", lease=lease_a["leaseId"], outcome="ok")
        _refused(over, 429, "too_many_reports")
        assert over.headers["Retry-After"] == "40"
        assert _report(client, "crawler-b", lease=lease_b["leaseId"], outcome="ok").status_code == 200
        clock.advance(40)
        assert _report(client, "crawler-a", lease=lease_a["leaseId"], outcome="ok").status_code == 200


def test_the_report_summary_names_who_said_what_and_only_what_was_taken(
    start_api: ApiFactory, store_factory: StoreFactory
) -> None:
    clock = FakeClock()
    api = start_api(inventory=healthy_inventory(["a"]), clock=clock)
    with api.client() as client:
        _refused(_report(client, "crawler-b", proxy="default/a", outcome="error"), 403, "not_a_leaseholder")
        lease_a = _lease(client, "crawler-a")
        for outcome in ("banned", "banned", "error"):  # the second ban is already counted, still a report
            assert _report(client, "crawler-a", lease=lease_a["leaseId"], outcome=outcome).status_code == 200
            clock.advance(1)
        _refused(
            _report(client, "crawler-a", lease=lease_a["leaseId"], target="other.example", outcome="ok"),
            409,
            "target_not_leased",
        )

    async def read() -> list[ReportEntry]:
        # The memory store is the API's own; a Redis one is any store on the same keys (another replica).
        store = api.discovery.store if isinstance(api.discovery.store, MemoryStore) else store_factory()
        try:
            return await store.reports_on("default/a", now=clock())
        finally:
            if store is not api.discovery.store:
                await store.close()

    entries = asyncio.run(read())
    start = FakeClock().now
    assert entries == [  # the refused reports count nowhere
        ReportEntry(target=TARGET, client="crawler-a", kind="error", count=1, last=start + 2),
        ReportEntry(target=TARGET, client="crawler-a", kind="banned", count=2, last=start + 1),
    ]
    assert lease_a["leaseId"] not in repr(entries)
