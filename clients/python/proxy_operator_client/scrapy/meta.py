"""The request meta keys the integration reads and writes, and how a request is judged ours."""

from __future__ import annotations

from scrapy import Request

USE_META = "proxy_operator"  # True: leased by us (set by the middleware); False: the spider opts out
SESSION_META = "proxy_session"  # a sticky session name: every request of it uses one proxy
LEASE_META = "proxy_operator_lease"  # what the handler leased: leaseId, key, target, proxy (no credentials)
VERDICT_META = "_proxy_operator_verdict"  # the handler's judgement of the answer (judge.Outcome value)
PARK_META = "_proxy_operator_park"  # a ticket: the parking takes the request out of Scrapy until then
_LEFTOVERS = ("proxy", "_auth_proxy", LEASE_META, VERDICT_META)


def wants_lease(request: Request) -> bool:
    """Ours unless the spider opted out or chose a proxy of its own (one that is not a leftover of ours)."""
    use = request.meta.get(USE_META)
    if use is not None:
        return bool(use)
    return "proxy" not in request.meta


def forget_lease(request: Request) -> None:
    """A retry, a redirect or a parked request carries the previous try's lease: it leases afresh."""
    for key in _LEFTOVERS:
        request.meta.pop(key, None)
    request.headers.pop(b"Proxy-Authorization", None)
