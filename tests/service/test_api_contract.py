"""What docs/api.md promises a client writing against it alone: empty bodies, unknown query parameters,
whoami, renewals, and sessions that belong to a client name (not to a target). Through a live uvicorn."""

from __future__ import annotations

from datetime import datetime

import httpx

from tests.service.conftest import ApiFactory, auth, healthy_inventory

LEASE = "/v1/leases"


def _expires(item: dict[str, str]) -> float:
    return datetime.fromisoformat(item["expiresAt"]).timestamp()


def test_a_lease_without_a_body_takes_every_default(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a", "b", "c"]), lease_ttl_seconds=45)
    with api.client() as client:
        bare = client.post(LEASE, headers=auth("crawler-a"))
        typed = client.post(
            LEASE, content=b"", headers={**auth("crawler-a"), "content-type": "application/json"}
        )
        empty_object = client.post(LEASE, json={}, headers=auth("crawler-a"))
    for response in (bare, typed, empty_object):
        assert response.status_code == 200, response.text
        body = response.json()
        assert (len(body["leases"]), body["target"], body["lowered"]) == (1, "*", {})
        assert _expires(body["leases"][0]) == api.clock.now + 45


def test_unknown_query_parameters_are_refused_naming_them(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a"]))
    with api.client() as client:
        typo = client.get("/v1/proxies", params={"healty": "true", "pool": "main"}, headers=auth("crawler-a"))
        assert typo.status_code == 422, typo.text
        error = typo.json()
        assert error["error"] == "invalid_request"
        assert [d["field"] for d in error["detail"]] == ["query.healty"]
        assert "healthy" in error["detail"][0]["message"]  # says what the route takes
        in_query = client.post(f"{LEASE}?count=2&target=x.example", json={}, headers=auth("crawler-a"))
        assert in_query.status_code == 422
        assert [d["field"] for d in in_query.json()["detail"]] == ["query.count", "query.target"]
        assert client.get("/v1/echo?x=1").status_code == 422
        known = client.get("/v1/proxies", params={"healthy": "true"}, headers=auth("crawler-a"))
        assert known.status_code == 200
        assert client.get("/healthz?probe=kubelet").status_code == 200  # probes take what kubelets send


def test_whoami_names_the_client_its_scopes_and_the_limits(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a"]), max_count=7, lease_ttl_max_seconds=900)
    with api.client() as client:
        me = client.get("/v1/whoami", headers=auth("crawler-a")).json()
        reporter = client.get("/v1/whoami", headers=auth("reporter")).json()
        anonymous = client.get("/v1/whoami")
    assert (me["name"], me["scopes"]) == ("crawler-a", ["lease", "report"])
    assert me["limits"] == {
        "maxCount": 7,
        "leaseTtlSeconds": 60.0,
        "leaseTtlMaxSeconds": 900.0,
        "maxWaitSeconds": 30.0,
        "cooldownSeconds": 10.0,
        "sessionIdleSeconds": 1800.0,
    }
    assert (reporter["name"], reporter["scopes"]) == ("reporter", ["report"])
    assert (anonymous.status_code, anonymous.json()["error"]) == (401, "unauthorized")


def renew(client: httpx.Client, lease_id: str, who: str = "crawler-a", **body: float) -> httpx.Response:
    return client.post(f"{LEASE}/{lease_id}/renew", json=body or None, headers=auth(who))


def test_renew_extends_a_lease_and_its_hold_within_the_limit(start_api: ApiFactory) -> None:
    api = start_api(
        inventory=healthy_inventory(["a"]),
        cooldown_seconds=0,
        lease_ttl_seconds=60,
        lease_ttl_max_seconds=600,
    )
    with api.client() as client:
        lease_id = client.post(LEASE, json={"target": "t.example"}, headers=auth("crawler-a")).json()[
            "leases"
        ][0]["leaseId"]
        api.clock.advance(50)
        longer = renew(client, lease_id, ttl=300)
        assert longer.status_code == 200, longer.text
        body = longer.json()
        assert (body["leaseId"], body["key"], body["target"]) == (lease_id, "default/a", "t.example")
        assert _expires(body) == api.clock.now + 300
        assert body["lowered"] == {}
        api.clock.advance(100)  # past the first end (60 s): still held for this client and target
        held = client.post(LEASE, json={"target": "t.example"}, headers=auth("crawler-a"))
        assert (held.status_code, held.headers["Retry-After"]) == (503, "1")  # its own: free on release
        assert "free in 200 s" in held.json()["detail"]
        capped = renew(client, lease_id, ttl=99999).json()
        assert _expires(capped) == api.clock.now + 600  # never past lease_ttl_max_seconds from now
        assert capped["lowered"] == {"ttl": 600}
        default = renew(client, lease_id).json()  # no body: the default lifetime, from now
        assert _expires(default) == api.clock.now + 60
        metrics = client.get("/metrics").text
    assert "proxy_operator_lease_renewals_total 3.0" in metrics


def test_renew_refuses_what_is_not_an_active_lease_of_yours(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a", "b"]), lease_ttl_seconds=60)
    with api.client() as client:
        mine, gone = (
            item["leaseId"]
            for item in client.post(LEASE, json={"count": 2}, headers=auth("crawler-a")).json()["leases"]
        )
        for response in (
            renew(client, mine, "crawler-b", ttl=10),  # another client's
            renew(client, "nope", ttl=10),
            renew(client, "x" * 200, ttl=10),
        ):
            assert (response.status_code, response.json()["error"]) == (404, "lease_not_found")
        assert client.delete(f"{LEASE}/{gone}", headers=auth("crawler-a")).status_code == 204
        assert renew(client, gone, ttl=10).status_code == 404  # released
        api.clock.advance(61)
        assert renew(client, mine, ttl=10).status_code == 404  # expired
        assert renew(client, mine, ttl=0).status_code == 422
        assert (
            client.post(f"{LEASE}/{mine}/renew", json={"ttl": 5}, headers=auth("reporter")).status_code == 403
        )


def test_a_session_belongs_to_the_client_name_across_targets(start_api: ApiFactory) -> None:
    """One session name, two targets: the same proxy (sessions are per client, not per target)."""
    api = start_api(inventory=healthy_inventory(["a", "b", "c"]), cooldown_seconds=60)
    with api.client() as client:

        def bound(who: str, target: str) -> str:
            body = {"target": target, "session": "cart"}
            return str(client.post(LEASE, json=body, headers=auth(who)).json()["leases"][0]["key"])

        first = bound("crawler-a", "one.example")
        assert bound("crawler-a", "two.example") == first  # same client, other target: same proxy
        assert bound("crawler-b", "one.example") != first  # same name, other client: its own session
