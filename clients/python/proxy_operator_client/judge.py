"""What an answer through a leased proxy says, and so what to report: docs/api.md's "What to report".

- a 407 from the proxy (its user is unknown, expired or revoked): `error`, reported `error`;
- an error whose `Proxy-Status` (RFC 9209) names `destination_ip_prohibited` or `http_request_denied`, or a
  CONNECT answered 403: `refused`, nothing reported (the proxy's egress policy, the same for every proxy);
- an error whose `Proxy-Status` names a `dns_`, `destination_`, `connection_`, `tls_` or `http_response_`
  type, or a CONNECT answered 502/504: `site_down`, nothing reported (the site is down for every proxy);
- any other error the proxy names, a CONNECT failing otherwise, no answer at all (refused, reset, timed
  out): `error`, reported `error`;
- a ban code of the site (403, 429 by default), or a page the caller's check calls a ban: `banned`;
- anything else the site answered (200, 404, its own 500): `ok`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

BAN_CODES = frozenset({403, 429})
PROXY_AUTH_REQUIRED = 407
# RFC 9209 error types: what a refusal by the proxy's policy and a site it could not reach are called.
REFUSALS = frozenset({"destination_ip_prohibited", "http_request_denied"})
SITE_DOWN = ("dns_", "destination_", "connection_", "tls_", "http_response_")  # prefixes of the types
CONNECT_REFUSED, CONNECT_SITE_DOWN = frozenset({403}), frozenset({502, 504})


class Outcome(StrEnum):
    OK = "ok"
    BANNED = "banned"
    ERROR = "error"
    REFUSED = "refused"  # the proxy's egress policy: not reported, not retried
    SITE_DOWN = "site_down"  # the proxy could not reach the site: not reported, retried later

    @property
    def report(self) -> str | None:
        """The report's `outcome`, or None when there is nothing to report about the proxy."""
        return self.value if self in (Outcome.OK, Outcome.BANNED, Outcome.ERROR) else None

    @property
    def try_another_proxy(self) -> bool:
        """A ban or a failing proxy: the same request through another proxy may well work."""
        return self in (Outcome.BANNED, Outcome.ERROR)


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    status: int | None = None  # the answer's status (of the failed CONNECT, for a tunnel)
    error: str | None = None  # the proxy's RFC 9209 error type, when it named one


def judge_answer(
    status: int,
    proxy_status: str | bytes | None,
    *,
    ban_codes: Collection[int] = BAN_CODES,
    looks_banned: bool = False,
) -> Verdict:
    """An HTTP answer: the proxy's own (407, or an error its `Proxy-Status` names) or the site's."""
    if status == PROXY_AUTH_REQUIRED:
        return Verdict(Outcome.ERROR, status)
    error = proxy_error(status, proxy_status)
    if error is not None:
        if error in REFUSALS:
            return Verdict(Outcome.REFUSED, status, error)
        return Verdict(Outcome.SITE_DOWN if error.startswith(SITE_DOWN) else Outcome.ERROR, status, error)
    if status in ban_codes or looks_banned:
        return Verdict(Outcome.BANNED, status)
    return Verdict(Outcome.OK, status)


def judge_failure(connect_status: int | None) -> Verdict:
    """A download that raised: a CONNECT the proxy answered `connect_status`, or no answer at all (None)."""
    if connect_status in CONNECT_REFUSED:
        return Verdict(Outcome.REFUSED, connect_status)
    if connect_status in CONNECT_SITE_DOWN:
        return Verdict(Outcome.SITE_DOWN, connect_status)
    return Verdict(Outcome.ERROR, connect_status)


def proxy_error(status: int, proxy_status: str | bytes | None) -> str | None:
    """The error type of the proxy's own answer: the `error` parameter of the last `Proxy-Status` member
    (the intermediary nearest to us, RFC 9209 section 2) of an error response; None for the site's answers."""
    if status < 400 or not proxy_status:
        return None
    value = proxy_status.decode("latin-1") if isinstance(proxy_status, bytes) else proxy_status
    for param in _split(_split(value, ",")[-1], ";")[1:]:
        name, _, token = param.partition("=")
        if name.strip() == "error":
            return token.strip()
    return None


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
