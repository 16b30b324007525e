"""What can go wrong, by what the caller does next.

ProxyOperatorError
├── ApiError          permanent: a 4xx answer (token, scope, invalid request, unknown lease, a strict
│                     session lost); retrying the same call gets the same answer
├── ApiUnavailable    transient: the API cannot be reached, or failed (5xx, an answer that is not ours);
│                     retry with backoff
├── NoProxyAvailable  transient: 503 nothing eligible, or 429 past this client's share or rate; retry
│                     after `retry_after` (a 429 `lease_share` also after one of your own releases)
├── ProxyAnswer       the proxy answered instead of the site (docs/api.md, "What to report")
│   ├── Refused       its egress policy refused the destination: every proxy would; ask the operator
│   └── SiteDown      it could not reach the site: the site is down for every proxy; try later
└── NoGoodAnswer      `fetch` gave up after its attempts (chained from the last reason)
"""

from __future__ import annotations


class ProxyOperatorError(Exception):
    """Every error of this package."""


class ApiError(ProxyOperatorError):
    """The API refused the call for good: `reason` is its stable `error` (docs/api.md, "Errors")."""

    def __init__(
        self, status: int, reason: str, detail: object = None, request_id: str | None = None
    ) -> None:
        super().__init__(f"{status} {reason}: {detail} (request {request_id})")
        self.status, self.reason, self.detail, self.request_id = status, reason, detail, request_id


class ApiUnavailable(ProxyOperatorError):
    """The API could not be reached or failed; `status` is None when no answer came at all."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NoProxyAvailable(ProxyOperatorError):
    """503 (`all_cooling_down`, `no_candidates`, ...) or 429 (`lease_share`, `lease_rate`): nothing for
    now; `retry_after` is the server's Retry-After in seconds."""

    def __init__(self, reason: str, retry_after: float) -> None:
        super().__init__(f"{reason}: retry after {retry_after:g} s")
        self.reason, self.retry_after = reason, retry_after


class ProxyAnswer(ProxyOperatorError):
    """The proxy answered instead of the site: `error` is the RFC 9209 type (None for a bare CONNECT)."""

    def __init__(self, url: str, key: str, status: int, error: str | None) -> None:
        super().__init__(f"{url}: {status} {error or 'CONNECT failed'} from proxy {key}")
        self.url, self.key, self.status, self.error = url, key, status, error


class Refused(ProxyAnswer):
    """The proxy's egress policy refused the destination (docs/security.md): ask the operator."""


class SiteDown(ProxyAnswer):
    """The proxy could not reach the site (refused, unresolved, timed out): try again later."""


class NoGoodAnswer(ProxyOperatorError):
    """`fetch` tried `attempts` times without a page; the last reason is its `__cause__`."""
