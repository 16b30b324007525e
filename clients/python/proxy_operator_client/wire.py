"""The API's bodies and answers, the same for the sync and the async client: what a call sends, what its
answer means (a result, or the error of errors.py that says what to do next)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from proxy_operator_client.errors import ApiError, ApiUnavailable, NoProxyAvailable

API_PREFIX = "/v1"
# A 429/503 without a usable Retry-After (the API always sends one; a proxy in front of it may not).
DEFAULT_RETRY_AFTER = 1.0


@dataclass(frozen=True)
class Lease:
    """One leased proxy (docs/api.md, `POST /v1/leases`). `url` carries the credentials: do not log it."""

    lease_id: str
    key: str
    target: str
    host: str
    port: int
    protocol: str
    expires_at: str
    credentials_scope: str
    egress_ip: str | None
    ttl: float | None  # what it was taken or last renewed with (None: the server's default)
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    url: str = field(default="", repr=False)

    @property
    def address(self) -> str:
        """The proxy's URL without credentials (for logs and Scrapy's `meta["proxy"]`)."""
        return f"{self.protocol}://{self.host}:{self.port}"

    def renewed(self, answer: dict[str, Any], ttl: float | None) -> Lease:
        used = answer.get("lowered", {}).get("ttl", ttl)
        return replace(self, expires_at=str(answer["expiresAt"]), ttl=used)


def lease_body(
    *, target: str | None, count: int, wait: float, ttl: float | None, filters: dict[str, Any]
) -> dict[str, Any]:
    body = {"target": target, "count": count, "wait": wait or None, "ttl": ttl, **filters}
    return {name: value for name, value in body.items() if value is not None}


def leases_from(answer: dict[str, Any], ttl: float | None) -> list[Lease]:
    used = answer.get("lowered", {}).get("ttl", ttl)
    return [
        Lease(
            lease_id=item["leaseId"],
            key=item["key"],
            target=str(answer.get("target", "*")),
            host=item["host"],
            port=int(item["port"]),
            protocol=item["protocol"],
            expires_at=item["expiresAt"],
            credentials_scope=item.get("credentialsScope", "proxy"),
            egress_ip=item.get("egressIp"),
            ttl=used,
            username=item.get("username"),
            password=item.get("password"),
            url=item["url"],
        )
        for item in answer["leases"]
    ]


def report_body(lease: Lease, outcome: str, status_code: int | None) -> dict[str, Any]:
    """A report names its lease, never another target (docs/api.md, "A report is about a lease")."""
    body: dict[str, Any] = {"lease": lease.lease_id, "outcome": outcome}
    if status_code is not None:
        body["statusCode"] = status_code
    return body


def checked(response: httpx.Response, *, leasing: bool = False) -> dict[str, Any]:
    """The answer's JSON body, or the error that says what to do next. While leasing, a 429 or 503 with
    one of our reasons means "no proxy for now" (NoProxyAvailable); any other 5xx, or an answer that is
    not the API's JSON, means the API is not there (ApiUnavailable); any other 4xx is permanent."""
    if response.status_code < 400:
        return _json(response) if response.content else {}
    body = _json(response)
    reason = body.get("error")
    if leasing and reason and response.status_code in (429, 503):
        raise NoProxyAvailable(str(reason), retry_after(response))
    if response.status_code >= 500 or not reason:
        raise ApiUnavailable(
            f"{response.status_code} {reason or 'answer not from the API'}", response.status_code
        )
    raise ApiError(response.status_code, str(reason), body.get("detail"), body.get("requestId"))


def retry_after(response: httpx.Response) -> float:
    try:
        seconds = float(response.headers.get("Retry-After", ""))
    except ValueError:
        return DEFAULT_RETRY_AFTER
    return seconds if math.isfinite(seconds) and seconds >= 0 else DEFAULT_RETRY_AFTER


def unavailable(exc: httpx.TransportError) -> ApiUnavailable:
    """A call that got no answer: connection refused or reset, a timeout, a broken answer."""
    return ApiUnavailable(f"{type(exc).__name__}: {exc}")


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
