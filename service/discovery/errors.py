"""Discovery's domain errors; the API turns each into one HTTP status at its edge (service/api/errors.py)."""

from __future__ import annotations


class DiscoveryError(Exception):
    """Base: `reason` is a stable machine-readable word, the message says what to do."""

    reason = "discovery_error"


class NoProxyAvailable(DiscoveryError):
    """Nothing eligible now. `retry_after` = seconds until the earliest candidate becomes eligible."""

    def __init__(self, message: str, *, reason: str, retry_after: float) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class SessionLost(DiscoveryError):
    """A strict session's proxy is gone, unhealthy, filtered out or banned for the target."""

    reason = "session_lost"


class LeaseNotFound(DiscoveryError):
    reason = "lease_not_found"


class ProxyNotFound(DiscoveryError):
    reason = "proxy_not_found"


class InvalidRequest(DiscoveryError):
    reason = "invalid_request"


class NotALeaseholder(DiscoveryError):
    """A report on a proxy the client does not hold and has not held within the report window."""

    reason = "not_a_leaseholder"


class TooManyReports(DiscoveryError):
    """The client sent more reports than its rate allows. `retry_after` = seconds until its window ends."""

    reason = "too_many_reports"

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class LeaseLimited(DiscoveryError):
    """The client's fair share (discovery/fair_share.py) is taken: `reason` names the limit
    (`lease_share`, `lease_rate`); `retry_after` = seconds until it lets one more lease through."""

    def __init__(self, message: str, *, reason: str, retry_after: float) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class LeaseRequired(DiscoveryError):
    """A report about a target (`banned`, `ok`) that names a proxy instead of the lease it is about."""

    reason = "lease_required"


class TargetNotLeased(DiscoveryError):
    """A report naming a target other than the one its lease was taken for."""

    reason = "target_not_leased"


class StoreUnavailable(DiscoveryError):
    """The shared store (Redis) did not answer in time or the connection to it failed: a 503 the client may
    retry after `retry_after` seconds, never a 500. The message (which names the store's address) goes to
    the log; the client gets `DETAIL`."""

    reason = "store_unavailable"
    retry_after = 1.0
    DETAIL = "the discovery store did not answer; retry after Retry-After"
