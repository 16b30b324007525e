"""A small client of the proxy-operator discovery API (docs/api.md), with httpx.

    client = DiscoveryClient("http://127.0.0.1:8080", token)
    page = client.fetch("https://example.com/", target="example.com")

`fetch` runs the loop every crawler runs: lease, fetch through the proxy, report, release. A ban answer
(403/429) is reported as `banned`, a failed download (connection error, or no answer within `timeout`)
as `error`, and the fetch is retried through another proxy. Leases taken with `lease()` and not released
are released by `close()`; `renew()` extends one. This file is run by the tests
(tests/service/test_python_client.py, against a live API, real proxies and a real site), so it stays true
to the API.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

log = logging.getLogger(__name__)

BAN_STATUSES = frozenset({403, 429})


@dataclass(frozen=True)
class Lease:
    lease_id: str
    key: str
    url: str  # ready for httpx's `proxy=` (credentials included)
    expires_at: str
    egress_ip: str | None


class NoProxyAvailable(Exception):
    def __init__(self, reason: str, retry_after: float) -> None:
        super().__init__(f"{reason}: retry after {retry_after:g} s")
        self.reason, self.retry_after = reason, retry_after


class DiscoveryClient:
    def __init__(self, base_url: str, token: str, *, timeout: float = 40.0) -> None:
        # The timeout must exceed the longest `wait` (30 s): the API holds waiting requests open.
        self._http = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout
        )
        self._live: dict[str, Lease] = {}  # taken and not yet released

    def lease(
        self, *, target: str | None = None, count: int = 1, wait: float = 0, **filters: Any
    ) -> list[Lease]:
        """Lease up to `count` proxies. Filters: pool, provider, labels, session, strict, ttl."""
        body = {"target": target, "count": count, "wait": wait, **filters}
        response = self._http.post("/v1/leases", json={k: v for k, v in body.items() if v is not None})
        if response.status_code == 503:
            raise NoProxyAvailable(response.json()["error"], float(response.headers["Retry-After"]))
        _raise_for_error(response)
        leases = [
            Lease(item["leaseId"], item["key"], item["url"], item["expiresAt"], item["egressIp"])
            for item in response.json()["leases"]
        ]
        self._live.update((lease.lease_id, lease) for lease in leases)
        return leases

    def renew(self, lease: Lease, *, ttl: float | None = None) -> Lease:
        """Make the lease end `ttl` seconds from now (the server lowers it to its maximum)."""
        body = {"ttl": ttl} if ttl is not None else None
        response = self._http.post(f"/v1/leases/{lease.lease_id}/renew", json=body)
        _raise_for_error(response)
        renewed = Lease(lease.lease_id, lease.key, lease.url, response.json()["expiresAt"], lease.egress_ip)
        self._live[lease.lease_id] = renewed
        return renewed

    def release(self, lease: Lease) -> None:
        self._live.pop(lease.lease_id, None)
        response = self._http.delete(f"/v1/leases/{lease.lease_id}")
        if response.status_code != 404:  # already ended: nothing to do
            _raise_for_error(response)

    def report(self, lease: Lease, outcome: str, *, status_code: int | None = None) -> dict[str, Any]:
        body = {"lease": lease.lease_id, "outcome": outcome, "statusCode": status_code}
        response = self._http.post("/v1/reports", json={k: v for k, v in body.items() if v is not None})
        _raise_for_error(response)
        return dict(response.json())

    def fetch(
        self, url: str, *, target: str, attempts: int = 3, wait: float = 10, timeout: float = 30
    ) -> httpx.Response:
        """GET `url` through a leased proxy; on a ban or a failed download, report it and try another.

        A site that does not answer within `timeout` is reported as `error`, like a proxy that fails:
        from here the two cannot be told apart (docs/api.md, "What to report").
        """
        last: Exception | None = None
        for _ in range(attempts):
            try:
                lease = self.lease(target=target, wait=wait)[0]
            except NoProxyAvailable as exc:
                time.sleep(min(exc.retry_after, 30))
                last = exc
                continue
            try:
                response = httpx.get(url, proxy=lease.url, timeout=timeout)
            except httpx.TransportError as exc:  # connect errors, resets, timeouts
                self._report_quietly(lease, "error")
                last = exc
                continue
            finally:
                self.release(lease)
            if response.status_code in BAN_STATUSES:
                self._report_quietly(lease, "banned", status_code=response.status_code)
                last = RuntimeError(f"{url} answered {response.status_code} through {lease.key}")
                continue
            self._report_quietly(lease, "ok", status_code=response.status_code)
            return response
        raise RuntimeError(f"no good answer from {url} after {attempts} attempts") from last

    def _report_quietly(self, lease: Lease, outcome: str, *, status_code: int | None = None) -> None:
        """A refused report (429 past the report rate, 403 when the lease is long over) must not fail a
        download that worked: say so and go on."""
        try:
            self.report(lease, outcome, status_code=status_code)
        except RuntimeError as exc:
            log.warning("report %s on %s not taken: %s", outcome, lease.key, exc)

    def close(self) -> None:
        """Release the leases still held, then close the connection to the API."""
        try:
            for lease in list(self._live.values()):
                self.release(lease)
        finally:
            self._http.close()

    def __enter__(self) -> DiscoveryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _raise_for_error(response: httpx.Response) -> None:
    if response.status_code >= 400:
        body = response.json()
        raise RuntimeError(
            f"{response.status_code} {body['error']}: {body['detail']} (request {body['requestId']})"
        )
