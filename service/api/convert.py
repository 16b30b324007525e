"""Inventory and store values -> API bodies."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import quote

import orjson

from service.api.models import HealthOut, LeasedProxy, PenaltyOut, ProxyDetail, ProxyOut
from service.discovery.lease_users import LeaseUser
from service.discovery.store import LeaseRecord, Penalty
from service.inventory import Health, Inventory, ProxyEndpoint

# pydantic's JSON for the values `lease_json` writes (no spaces, UTF-8 as is, the same escapes), a tenth of
# the CPU of the standard library's encoder (a twentieth of a lease's, issue 20: docs/decisions.md)
_ENCODE = orjson.dumps


def timestamp(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


# What `quote(text, safe="")` leaves as it is (urllib's always-safe characters, ASCII only): most user names
# and passwords, the lease users' always. Checked first, it spares two `quote` calls per lease (about 1 us).
_UNQUOTED = re.compile(r"[A-Za-z0-9_.~-]*").fullmatch


def quoted(text: str) -> str:
    """`urllib.parse.quote(text, safe="")`, at once for text it would leave as it is."""
    return text if _UNQUOTED(text) else quote(text, safe="")


def proxy_url(endpoint: ProxyEndpoint, *, username: str | None, password: str | None) -> str:
    host = f"[{endpoint.host}]" if endpoint.host and ":" in endpoint.host else endpoint.host
    auth = ""
    if username is not None:
        auth = f"{quoted(username)}:{quoted(password or '')}@"
    return f"{endpoint.protocol}://{auth}{host}:{endpoint.port}"


def health_out(health: Health) -> HealthOut:
    return HealthOut(
        state=health.state.value,
        egress_ip=health.egress_ip,
        consecutive_failures=health.consecutive_failures,
        consecutive_successes=health.consecutive_successes,
        last_probe_at=timestamp(health.last_probe_at) if health.last_probe_at is not None else None,
        last_latency_seconds=health.last_latency_seconds,
        last_error=health.last_error,
    )


def proxy_out(endpoint: ProxyEndpoint, *, health: Health, shared: Mapping[str, list[str]]) -> ProxyOut:
    others = [k for k in shared.get(health.egress_ip or "", []) if k != endpoint.key]
    return ProxyOut(
        key=endpoint.key,
        namespace=endpoint.namespace,
        name=endpoint.name,
        provider=endpoint.provider,
        pool=endpoint.pool,
        labels=dict(endpoint.labels),
        protocol=endpoint.protocol,
        host=endpoint.host,
        port=endpoint.port,
        stack=endpoint.stack,
        health=health_out(health),
        shared_egress_with=others,
    )


def proxy_detail(base: ProxyOut, penalties: list[Penalty]) -> ProxyDetail:
    return ProxyDetail(
        **base.model_dump(),
        penalties=[
            PenaltyOut(target=p.target, until=timestamp(p.until), strikes=p.strikes) for p in penalties
        ],
    )


def leased(
    lease: LeaseRecord, *, endpoint: ProxyEndpoint, health: Health, user: LeaseUser | None
) -> LeasedProxy:
    """The lease's own user when it has one (the proxy's credentials then never leave the service)."""
    # only addressed proxies are candidates
    assert endpoint.host is not None
    assert endpoint.port is not None
    username, password = (user.username, user.password) if user else (endpoint.username, endpoint.password)
    return LeasedProxy(
        lease_id=lease.lease_id,
        expires_at=timestamp(lease.expires_at),
        key=endpoint.key,
        url=proxy_url(endpoint, username=username, password=password),
        host=endpoint.host,
        port=endpoint.port,
        protocol="socks5" if endpoint.protocol == "socks5" else "http",
        username=username,
        password=password,
        credentials_scope="lease" if user else "proxy",
        pool=endpoint.pool,
        provider=endpoint.provider,
        egress_ip=health.egress_ip,
    )


def lease_json(
    leases: list[LeaseRecord],
    users: Mapping[str, LeaseUser],
    inventory: Inventory,
    *,
    answer: dict[str, object],
) -> bytes | None:
    """`LeaseResponse(leases=[leased(...) ...], **answer).model_dump_json()` written without the models (a
    sixth of a lease's CPU in the server, issue 20), or None where the two might differ (floats, in
    `lowered`; text that is not UTF-8): the caller then builds the models. `answer` holds the response's
    other fields, by their JSON names. tests/service/test_api_fast_lease.py holds the two to the same bytes.
    """
    if answer.get("lowered"):
        return None
    items = []
    for lease in leases:
        endpoint = inventory.get(lease.proxy)
        if endpoint is None or not endpoint.has_address:  # removed in the last instant: leave it out
            continue
        user = users.get(lease.lease_id)
        username, password = (
            (user.username, user.password) if user else (endpoint.username, endpoint.password)
        )
        expires = datetime.fromtimestamp(lease.expires_at, tz=UTC).isoformat()
        items.append(
            {
                "leaseId": lease.lease_id,
                "expiresAt": expires.removesuffix("+00:00") + "Z",
                "key": endpoint.key,
                "url": proxy_url(endpoint, username=username, password=password),
                "host": endpoint.host,
                "port": endpoint.port,
                "protocol": "socks5" if endpoint.protocol == "socks5" else "http",
                "username": username,
                "password": password,
                "credentialsScope": "lease" if user else "proxy",
                "pool": endpoint.pool,
                "provider": endpoint.provider,
                "egressIp": inventory.health(lease.proxy).egress_ip,
            }
        )
    try:
        return _ENCODE({"leases": items, **answer})
    except orjson.JSONEncodeError:  # text that is not UTF-8 (a lone surrogate): the models write it
        return None
