"""The client package's decisions one by one: how an answer through a proxy is judged (docs/api.md's "What
to report", row by row), what each API answer means to a caller, when the Scrapy integration may ask for a
lease again; and the async client's calls against a live API with real pproxy processes. (The clients run
whole in test_python_client.py, under a real spider in test_scrapy_middleware.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from proxy_operator_client import ApiError, ApiUnavailable, AsyncDiscoveryClient, NoProxyAvailable, Outcome
from proxy_operator_client.fetching import Judge, connect_status
from proxy_operator_client.judge import judge_answer, judge_failure
from proxy_operator_client.scrapy.gates import API_BACK, EVERY_SITE, OWN_RELEASE, Gates, NoLeaseYet
from proxy_operator_client.scrapy.leases import tunnel_status
from proxy_operator_client.wire import checked
from service.inventory import Health, HealthState, Inventory
from tests.service.conftest import TOKENS, ApiFactory, FakeClock, Pproxy, auth, endpoint

DENIED = "proxy-operator; error=destination_ip_prohibited"


@pytest.mark.parametrize(
    ("status", "proxy_status", "outcome"),
    [
        (200, None, Outcome.OK),  # a good page
        (404, None, Outcome.OK),  # the site's own error page: the proxy did its job
        (500, None, Outcome.OK),
        (503, None, Outcome.OK),  # a 502/503/504 without Proxy-Status is the site's
        (403, None, Outcome.BANNED),  # "this IP is blocked here"
        (429, None, Outcome.BANNED),
        (407, None, Outcome.ERROR),  # the proxy refused the lease's user: the proxy failing, never a page
        (407, "proxy-operator; error=http_request_denied", Outcome.ERROR),
        (403, DENIED, Outcome.REFUSED),  # the proxy's egress policy: not a ban
        (403, "proxy-operator; error=http_request_denied", Outcome.REFUSED),
        (502, "proxy-operator; error=connection_refused", Outcome.SITE_DOWN),
        (502, "proxy-operator; error=dns_error", Outcome.SITE_DOWN),
        (504, "proxy-operator; error=connection_timeout", Outcome.SITE_DOWN),
        (502, "proxy-operator; error=proxy_internal_error", Outcome.ERROR),  # another error it names
        (200, DENIED, Outcome.OK),  # Proxy-Status on a success is no error
        # Several intermediaries: the last member is the one nearest to us, which answered.
        (
            502,
            "far; error=destination_ip_prohibited, proxy-operator; error=connection_refused",
            Outcome.SITE_DOWN,
        ),
    ],
)
def test_an_answer_is_judged_as_the_api_reference_says(
    status: int, proxy_status: str, outcome: Outcome
) -> None:
    assert judge_answer(status, proxy_status).outcome is outcome


def test_a_ban_check_calls_a_block_page_a_ban_and_reports_follow_outcomes() -> None:
    judge = Judge(is_ban=lambda response: b"captcha" in response.content)
    assert judge(httpx.Response(200, content=b"solve this captcha")).outcome is Outcome.BANNED
    assert judge(httpx.Response(200, content=b"<html>ok</html>")).outcome is Outcome.OK
    assert [o.report for o in Outcome] == ["ok", "banned", "error", None, None]
    assert [o.try_another_proxy for o in Outcome] == [False, True, True, False, False]


@pytest.mark.parametrize(
    ("connect", "outcome"),
    [
        (403, Outcome.REFUSED),
        (502, Outcome.SITE_DOWN),
        (504, Outcome.SITE_DOWN),
        (407, Outcome.ERROR),
        (None, Outcome.ERROR),
    ],
)
def test_a_failed_download_is_judged_by_its_connect_answer(connect: int | None, outcome: Outcome) -> None:
    assert judge_failure(connect).outcome is outcome


def test_a_failed_connect_is_read_from_httpx_and_from_scrapy() -> None:
    assert connect_status(httpx.ProxyError("407 Proxy Authentication Required")) == 407
    assert connect_status(httpx.ConnectError("refused")) is None

    class TunnelError(Exception):  # Scrapy's, by name: its message carries the status
        pass

    failed = TunnelError(
        "Could not open CONNECT tunnel with proxy 127.0.0.1:3128 [{'status': 403, 'reason': b'Forbidden'}]"
    )
    assert tunnel_status(failed) == 403
    assert tunnel_status(ConnectionRefusedError()) is None


def answer(status: int, body: Any = None, **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers) if body is not None else httpx.Response(status)


@pytest.mark.parametrize(
    ("response", "leasing", "raised"),
    [
        (answer(503, {"error": "all_cooling_down"}, **{"Retry-After": "7"}), True, NoProxyAvailable),
        (answer(429, {"error": "lease_share"}, **{"Retry-After": "3"}), True, NoProxyAvailable),
        (answer(503, {"error": "no_candidates"}), True, NoProxyAvailable),
        (answer(429, {"error": "too_many_reports"}, **{"Retry-After": "3"}), False, ApiError),
        (answer(503, {"error": "not_ready"}), False, ApiUnavailable),
        (answer(502), True, ApiUnavailable),  # a proxy in front of the API, not the API
        (answer(500, {"error": "internal_error"}), True, ApiUnavailable),
        (answer(401, {"error": "unauthorized", "detail": "no token"}), True, ApiError),
        (answer(409, {"error": "session_lost"}), True, ApiError),
        (answer(404, {"error": "lease_not_found"}), False, ApiError),
    ],
)
def test_each_api_answer_says_what_to_do_next(response: httpx.Response, leasing: bool, raised: type) -> None:
    with pytest.raises(raised) as caught:
        checked(response, leasing=leasing)
    if isinstance(caught.value, NoProxyAvailable):
        assert caught.value.retry_after == float(response.headers.get("Retry-After", "1"))


def test_gates_close_per_site_or_for_all_and_open_on_our_own_release() -> None:
    clock = FakeClock()
    gates = Gates(clock)
    gates.check("shop.example")  # open
    cooling = gates.refused("shop.example", NoProxyAvailable("all_cooling_down", 30))
    assert (cooling.seconds, cooling.wake) == (30, "shop.example")
    with pytest.raises(NoLeaseYet):
        gates.check("shop.example")
    gates.check("news.example")  # another site is not held back
    gates.released("shop.example")  # our own lease on it ended: ask again
    gates.check("shop.example")

    share = gates.refused("shop.example", NoProxyAvailable("lease_share", 60))
    assert share.wake == OWN_RELEASE
    with pytest.raises(NoLeaseYet) as refused:
        gates.check("shop.example")
    assert refused.value.reason == "lease_share"
    gates.check("news.example")  # the share may be held by shop's bans, which hold news back in nothing
    gates.released("anything.example")  # any of our releases frees our share
    gates.check("shop.example")

    down = gates.unreachable(2.0)
    assert (down.wake, down.reason) == (API_BACK, "api_unavailable")
    clock.advance(1)
    with pytest.raises(NoLeaseYet) as waiting:
        gates.check("shop.example")
    assert waiting.value.seconds == pytest.approx(1.0)
    gates.reached()
    gates.check("shop.example")
    assert EVERY_SITE == ""


def test_a_site_at_its_concurrency_waits_for_one_of_its_leases() -> None:
    gates = Gates(FakeClock())
    gates.enter("shop.example")
    gates.enter("shop.example")
    with pytest.raises(NoLeaseYet) as busy:
        gates.check("shop.example", concurrency=2)
    assert (busy.value.wake, busy.value.reason) == ("shop.example", "site_concurrency")
    gates.check("news.example", concurrency=2)
    gates.leave("shop.example")
    gates.check("shop.example", concurrency=2)


@pytest.mark.parametrize("store_kind", ["memory"])
def test_the_async_client_leases_renews_reports_and_releases(
    start_api: ApiFactory, pproxies: Callable[..., Pproxy]
) -> None:
    inventory = Inventory()
    inventory.replace_all([endpoint(n, port=pproxies().port, username="user", password="pass") for n in "ab"])
    for key in ("default/a", "default/b"):
        inventory.set_health(key, Health(state=HealthState.healthy, egress_ip="127.0.0.1"))
    api = start_api(inventory=inventory, cooldown_seconds=0, lease_ttl_seconds=60)

    async def steps() -> tuple[Any, ...]:
        async with AsyncDiscoveryClient(api.url, TOKENS["crawler-a"][0]) as client:
            [lease] = await client.lease(target="shop.example", ttl=30)
            renewed = await client.renew(lease, ttl=7200)  # above the maximum: lowered
            report = await client.report(lease, "banned", status_code=429)
            await client.release(lease)
            await client.release(lease)  # already ended: nothing to do
            with pytest.raises(ApiError) as unknown:
                await client.renew(lease)
            [other] = await client.lease(target="shop.example")  # the banned proxy is kept away
            return lease, renewed, report, unknown.value, other

    lease, renewed, report, unknown, other = asyncio.run(steps())
    assert (lease.target, lease.ttl, renewed.ttl) == ("shop.example", 30, 3600)
    assert lease.address == f"http://127.0.0.1:{lease.port}"
    assert "password" not in repr(lease)
    assert (report["effect"], unknown.reason) == ("penalised", "lease_not_found")
    assert other.key != lease.key
    with api.client() as http:  # the client's close released `other`, the lease it still held
        again = http.post("/v1/leases", json={"target": "shop.example"}, headers=auth("crawler-a"))
    assert again.json()["leases"][0]["key"] == other.key
