"""Probes, echo, proxies, stacks, auth and the error envelope, through a live uvicorn."""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import BaseModel

from service.inventory import Health, HealthState, Inventory
from tests.service.conftest import ApiFactory, auth, endpoint, healthy_inventory


class FakeStackInspector:
    """A stand-in for the lead's real StackInspector (which reads Pulumi state): two canned stacks."""

    class Stack(BaseModel):
        name: str
        resources: int

    def list_stacks(self) -> list[Any]:
        return [self.Stack(name="local", resources=3), {"name": "gcp-eu", "resources": 0}]

    def get_stack(self, name: str) -> Any:
        return {"local": self.Stack(name="local", resources=3)}.get(name)


def _error(response: httpx.Response, status: int, reason: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == reason
    assert body["requestId"] == response.headers["x-request-id"]
    return body


def test_probes_and_readiness(start_api: ApiFactory) -> None:
    inventory = Inventory()
    api = start_api(inventory=inventory)
    with api.client() as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        not_ready = client.get("/readyz")
        assert "desired state" in _error(not_ready, 503, "not_ready")["detail"]
        inventory.mark_loaded()
        assert client.get("/readyz").json() == {"status": "ready"}


def test_metrics_count_leases(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a"]))
    with api.client() as client:
        client.post("/v1/leases", json={}, headers=auth("crawler-a"))
        text = client.get("/metrics").text
    assert 'proxy_operator_lease_requests_total{outcome="ok"} 1.0' in text
    assert "proxy_operator_leased_proxies_total 1.0" in text


def test_echo_answers_the_callers_address(start_api: ApiFactory) -> None:
    api = start_api(inventory=Inventory())
    with api.client() as client:
        assert client.get("/v1/echo").json()["ip"] == "127.0.0.1"


def test_auth_401_and_403(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a"]))
    with api.client() as client:
        missing = client.post("/v1/leases", json={})
        _error(missing, 401, "unauthorized")
        assert missing.headers["WWW-Authenticate"].startswith("Bearer")
        wrong = client.post("/v1/leases", json={}, headers={"Authorization": "Bearer nope"})
        _error(wrong, 401, "unauthorized")
        assert 'error="invalid_token"' in wrong.headers["WWW-Authenticate"]
        basic = client.get("/v1/proxies", headers={"Authorization": "Basic dXNlcjpwYXNz"})
        _error(basic, 401, "unauthorized")
        no_scope = client.post("/v1/leases", json={}, headers=auth("reporter"))
        _error(no_scope, 403, "forbidden")
        assert 'scope="lease"' in no_scope.headers["WWW-Authenticate"]
        _error(client.get("/v1/stacks", headers=auth("crawler-a")), 403, "forbidden")
        _error(client.post("/v1/reports", json={}, headers=auth("admin")), 403, "forbidden")


def test_proxies_list_filters_and_shared_egress(start_api: ApiFactory) -> None:
    inventory = healthy_inventory(["a", "b"])
    inventory.upsert(endpoint("c", pool="other", labels={"zone": "eu"}))
    inventory.set_health("default/c", Health(state=HealthState.unhealthy, egress_ip="10.0.0.9"))
    inventory.upsert(endpoint("d", host=None, port=None))  # no address yet
    api = start_api(inventory=inventory)
    with api.client() as client:
        get = lambda **params: client.get("/v1/proxies", params=params, headers=auth("reporter")).json()  # noqa: E731
        everything = get()
        assert [p["key"] for p in everything["items"]] == ["default/a", "default/b", "default/c", "default/d"]
        assert everything["sharedEgress"] == [{"ip": "127.0.0.1", "proxies": ["default/a", "default/b"]}]
        assert everything["items"][0]["sharedEgressWith"] == ["default/b"]
        assert "password" not in everything["items"][0]
        assert [p["key"] for p in get(healthy="true")["items"]] == ["default/a", "default/b"]
        assert [p["key"] for p in get(pool="other")["items"]] == ["default/c"]
        assert [p["key"] for p in get(labels="zone=eu")["items"]] == ["default/c"]
        assert get(provider="gcp")["count"] == 0
        bad = client.get("/v1/proxies", params={"labels": "zone"}, headers=auth("reporter"))
        assert _error(bad, 422, "invalid_request")["detail"][0]["field"] == "query.labels"
        one = client.get("/v1/proxies/default/c", headers=auth("crawler-a")).json()
        assert one["health"]["state"] == "unhealthy"
        assert one["penalties"] == []
        _error(client.get("/v1/proxies/default/zz", headers=auth("crawler-a")), 404, "proxy_not_found")


def test_stacks_need_admin_and_use_the_inspector(start_api: ApiFactory) -> None:
    api = start_api(inventory=Inventory(), stacks=FakeStackInspector())
    with api.client() as client:
        listed = client.get("/v1/stacks", headers=auth("admin")).json()
        assert [s["name"] for s in listed["items"]] == ["local", "gcp-eu"]
        assert client.get("/v1/stacks/local", headers=auth("admin")).json() == {
            "name": "local",
            "resources": 3,
        }
        _error(client.get("/v1/stacks/nope", headers=auth("admin")), 404, "stack_not_found")


def test_stacks_without_an_inspector_is_503(start_api: ApiFactory) -> None:
    api = start_api(inventory=Inventory())
    with api.client() as client:
        _error(client.get("/v1/stacks", headers=auth("admin")), 503, "unavailable")


def test_every_error_is_json_with_the_request_id(start_api: ApiFactory) -> None:
    api = start_api(inventory=Inventory())
    with api.client() as client:
        given = client.get("/nowhere", headers={"X-Request-ID": "trace-42"})
        assert _error(given, 404, "not_found")["requestId"] == "trace-42"
        _error(client.put("/v1/leases"), 405, "method_not_allowed")
        bogus_id = client.get("/nowhere", headers={"X-Request-ID": "no spaces allowed"})
        assert bogus_id.headers["x-request-id"] != "no spaces allowed"


def test_an_undecodable_body_is_400(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["a"]))
    headers = {**auth("crawler-a"), "content-type": "application/json"}
    with api.client() as client:
        _error(client.post("/v1/leases", content=b"\xff\xfe{", headers=headers), 400, "bad_request")


def test_openapi_and_docs_are_served(start_api: ApiFactory) -> None:
    api = start_api(inventory=Inventory())
    with api.client() as client:
        schema = client.get("/openapi.json").json()
        assert client.get("/docs").status_code == 200
    leases = schema["paths"]["/v1/leases"]["post"]
    assert {"200", "401", "403", "409", "422", "503"} <= set(leases["responses"])
    assert "Retry-After" in leases["responses"]["503"]["headers"]
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
