"""A small client of the proxy-operator discovery API (docs/api.md), with httpx.

    client = DiscoveryClient("http://127.0.0.1:8080", token)
    page = client.fetch("https://example.com/", target="example.com")

`fetch` runs the loop every crawler runs: lease, fetch through the proxy, report, release. A ban answer
(403/429) is reported as `banned`, a failed download (connection error, or no answer within `timeout`)
as `error`, and the fetch is retried through another proxy.

The proxy's own answers are not the site's (docs/security.md, "The proxies"): a plain-HTTP answer whose
`Proxy-Status` header (RFC 9209) names an error, or a CONNECT that failed (no site answered at all). A
refusal by the proxy's egress policy (`destination_ip_prohibited`, or a CONNECT answered 403) raises
`Refused`; a site the proxy could not reach (`connection_refused`, `dns_error`, ..., or a CONNECT answered
502/504) raises `SiteDown`. Neither is reported (not a ban, and the proxy did its job) nor retried: the
destination is refused or down whichever proxy asks. Any other error the proxy names is reported as
`error` and retried. Leases taken with `lease()` and not released
are released by `close()`; `renew()` extends one. This file is run by the tests
(tests/service/test_python_client.py, against a live API, real proxies and a real site), so it stays true
to the API.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import httpx

log = logging.getLogger(__name__)

BAN_STATUSES = frozenset({403, 429})
# RFC 9209 error types: what a refusal by the proxy's policy and a site it could not reach are called.
REFUSALS = frozenset({"destination_ip_prohibited", "http_request_denied"})
SITE_DOWN = ("dns_", "destination_", "connection_", "tls_", "http_response_")  # prefixes of the types
CONNECT_REFUSED, CONNECT_SITE_DOWN = frozenset({403}), frozenset({502, 504})


@dataclass(frozen=True)
class Lease:
    lease_id: str
    key: str
    url: str  # ready for httpx's `proxy=` (credentials included)
    expires_at: str
    egress_ip: str | None


class NoProxyAvailable(Exception):
    """503 (nothing eligible: `all_cooling_down`, `no_candidates`) or 429 (this client's fair share:
    `lease_share`, `lease_rate`); `retry_after` is the server's Retry-After in seconds."""

    def __init__(self, reason: str, retry_after: float) -> None:
        super().__init__(f"{reason}: retry after {retry_after:g} s")
        self.reason, self.retry_after = reason, retry_after


class ProxyAnswer(Exception):
    """The proxy answered instead of the site: `error` is the RFC 9209 type (None for a bare CONNECT)."""

    def __init__(self, url: str, key: str, status: int, error: str | None) -> None:
        super().__init__(f"{url}: {status} {error or 'CONNECT failed'} from proxy {key}")
        self.url, self.key, self.status, self.error = url, key, status, error


class Refused(ProxyAnswer):
    """The proxy's egress policy refused the destination (docs/security.md): ask the operator."""


class SiteDown(ProxyAnswer):
    """The proxy could not reach the site (refused, unresolved, timed out): try again later."""


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
        if response.status_code in (429, 503):  # past this client's share or rate, or nothing eligible
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
        from here the two cannot be told apart (docs/api.md, "What to report"). The proxy's own refusal
        raises `Refused`, a site it could not reach `SiteDown`: neither is reported nor retried.
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
                answer: httpx.Response | httpx.TransportError = httpx.get(
                    url, proxy=lease.url, timeout=timeout
                )
            except httpx.TransportError as exc:  # connect errors, resets, timeouts, a failed CONNECT
                answer = exc
            finally:
                self.release(lease)
            judged = self._judge(url, lease, answer)
            if isinstance(judged, httpx.Response):
                return judged
            last = judged
        raise RuntimeError(f"no good answer from {url} after {attempts} attempts") from last

    def _judge(
        self, url: str, lease: Lease, answer: httpx.Response | httpx.TransportError
    ) -> httpx.Response | Exception:
        """Report what `answer` says about the proxy; the page when it is one, the reason to retry when not.
        The proxy's own refusal or a site it could not reach raise (nothing reported)."""
        if isinstance(answer, httpx.TransportError):
            status = connect_status(answer)
            kind = answer_kind(connect=status)
            if kind is not None and status is not None:
                raise kind(url, lease.key, status, None) from answer
            self._report_quietly(lease, "error")
            return answer
        status, error = answer.status_code, proxy_error(answer)
        kind = answer_kind(error=error)
        if kind is not None:
            raise kind(url, lease.key, status, error)
        if error is not None:  # the proxy failed on its own (RFC 9209 names it): its health, not a ban
            self._report_quietly(lease, "error", status_code=status)
            return RuntimeError(f"{url}: proxy {lease.key} answered {status} {error}")
        if status in BAN_STATUSES:
            self._report_quietly(lease, "banned", status_code=status)
            return RuntimeError(f"{url} answered {status} through {lease.key}")
        self._report_quietly(lease, "ok", status_code=status)
        return answer

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


def proxy_error(response: httpx.Response) -> str | None:
    """The error type of the proxy's own answer: the `error` parameter of the last `Proxy-Status` member
    (the intermediary nearest to us, RFC 9209 section 2) of an error response; None for the site's answers."""
    value = response.headers.get("Proxy-Status")
    if response.status_code < 400 or not value:
        return None
    for param in _split(_split(value, ",")[-1], ";")[1:]:
        name, _, token = param.partition("=")
        if name.strip() == "error":
            return token.strip()
    return None


def connect_status(exc: Exception) -> int | None:
    """The status of a failed CONNECT (httpx raises ProxyError("403 Forbidden")); None for other errors."""
    found = re.match(r"(\d{3})\b", str(exc)) if isinstance(exc, httpx.ProxyError) else None
    return int(found.group(1)) if found else None


def answer_kind(*, error: str | None = None, connect: int | None = None) -> type[ProxyAnswer] | None:
    """Refused or SiteDown for the proxy's own answer, told by its RFC 9209 error type or, for a tunnel,
    by the failed CONNECT's status; None when it is neither (a proxy failure, or the site's answer)."""
    if error is not None:
        if error in REFUSALS:
            return Refused
        return SiteDown if error.startswith(SITE_DOWN) else None
    if connect in CONNECT_REFUSED:
        return Refused
    return SiteDown if connect in CONNECT_SITE_DOWN else None


def _split(text: str, separator: str) -> list[str]:
    """Split a structured-field list on `separator` outside quoted strings."""
    parts, current, quoted, escaped = [], "", False, False
    for char in text:
        if char == separator and not quoted:
            parts.append(current)
            current = ""
            continue
        current += char
        quoted = quoted != (char == '"' and not escaped)
        escaped = char == "\\" and not escaped
    return [*parts, current]


def _raise_for_error(response: httpx.Response) -> None:
    if response.status_code >= 400:
        body = response.json()
        raise RuntimeError(
            f"{response.status_code} {body['error']}: {body['detail']} (request {body['requestId']})"
        )
