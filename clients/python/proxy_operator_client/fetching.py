"""The decisions of `fetch`, shared by the sync and the async client so that both behave the same: what an
answer through a proxy comes to, and how long to pause when no lease could be had."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

import httpx

from proxy_operator_client.backoff import Backoff
from proxy_operator_client.errors import (
    ApiUnavailable,
    NoProxyAvailable,
    ProxyOperatorError,
    Refused,
    SiteDown,
)
from proxy_operator_client.judge import BAN_CODES, Outcome, Verdict, judge_answer, judge_failure
from proxy_operator_client.wire import Lease

TTL_MARGIN = 10.0  # seconds a fetch's lease outlives its download timeout

Answer = httpx.Response | httpx.TransportError
BanCheck = Callable[[httpx.Response], bool]


@dataclass(frozen=True)
class Judge:
    """How answers are judged: the site's ban codes, and optionally a check that calls a page a ban (a
    captcha or block page served with 200)."""

    ban_codes: Collection[int] = BAN_CODES
    is_ban: BanCheck | None = None

    def __call__(self, answer: Answer) -> Verdict:
        if isinstance(answer, httpx.TransportError):
            return judge_failure(connect_status(answer))
        looks_banned = self.is_ban is not None and answer.status_code < 400 and self.is_ban(answer)
        return judge_answer(
            answer.status_code,
            answer.headers.get("Proxy-Status"),
            ban_codes=self.ban_codes,
            looks_banned=looks_banned,
        )


def settle(url: str, lease: Lease, answer: Answer, verdict: Verdict) -> httpx.Response | Exception:
    """The page when it is one; the reason to try another proxy when not. A refusal by the proxy's policy
    or a site it could not reach raise: another proxy would answer the same."""
    if verdict.outcome in (Outcome.REFUSED, Outcome.SITE_DOWN):
        kind = Refused if verdict.outcome is Outcome.REFUSED else SiteDown
        cause = answer if isinstance(answer, Exception) else None
        raise kind(url, lease.key, verdict.status or 0, verdict.error) from cause
    if verdict.outcome is Outcome.OK and isinstance(answer, httpx.Response):
        return answer
    if isinstance(answer, Exception):
        return answer
    return ProxyOperatorError(f"{url}: {verdict.outcome} ({answer.status_code}) through {lease.key}")


def connect_status(exc: Exception) -> int | None:
    """The status of a failed CONNECT (httpx raises ProxyError("403 Forbidden")); None for other errors."""
    found = re.match(r"(\d{3})\b", str(exc)) if isinstance(exc, httpx.ProxyError) else None
    return int(found.group(1)) if found else None


def fetch_ttl(ttl: float | None, timeout: float) -> float:
    """A fetch's lease lasts its whole download, so it needs no renewal."""
    return ttl if ttl is not None else timeout + TTL_MARGIN


def pause(exc: NoProxyAvailable | ApiUnavailable, *, tries: int, backoff: Backoff, left: float) -> float:
    """Seconds to wait before leasing again, within the `left` seconds of patience: Retry-After for "no
    proxy for now", the backoff for an API that is not there."""
    seconds = exc.retry_after if isinstance(exc, NoProxyAvailable) else backoff.delay(tries)
    return max(0.0, min(seconds, left))


def waits_for_own_release(exc: Exception) -> bool:
    """Past its share of the pool a client frees a proxy by releasing one of its own leases."""
    return isinstance(exc, NoProxyAvailable) and exc.reason == "lease_share"
