"""`/v1/proxies`: what the inventory holds, with health, shared egress IPs and penalties (no credentials)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from service.api.convert import proxy_detail, proxy_out
from service.api.deps import Context, ReaderClient
from service.api.errors import ApiError, responses
from service.api.models import ProxyDetail, ProxyList, SharedEgress
from service.discovery.candidates import matches
from service.health.egress import shared_egress

router = APIRouter(tags=["proxies"])
LABELS_HELP = "comma-separated key=value pairs, all must match, e.g. zone=eu,tier=a"
_PAIR = r"[A-Za-z0-9][A-Za-z0-9._/-]*=[A-Za-z0-9._-]*"
LABELS_PATTERN = rf"^{_PAIR}(,{_PAIR})*$"


def parse_labels(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    labels = {}
    for pair in text.split(","):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ApiError(
                422, "invalid_request", [{"field": "query.labels", "message": f"want {LABELS_HELP}"}]
            )
        labels[key.strip()] = value.strip()
    return labels


@router.get(
    "/v1/proxies", response_model=ProxyList, responses=responses(401, 403, 422), summary="List proxies"
)
async def list_proxies(
    ctx: Context,
    _client: ReaderClient,
    pool: Annotated[str | None, Query(max_length=253)] = None,
    provider: Annotated[str | None, Query(max_length=253)] = None,
    labels: Annotated[
        str | None, Query(max_length=4096, pattern=LABELS_PATTERN, description=LABELS_HELP)
    ] = None,
    protocol: Literal["http", "socks5"] | None = None,
    healthy: bool | None = None,
) -> ProxyList:
    wanted = parse_labels(labels)
    health = {ep.key: ctx.inventory.health(ep.key) for ep in ctx.inventory.endpoints()}
    shared = shared_egress(health)
    items = [
        proxy_out(ep, health=health[ep.key], shared=shared)
        for ep in sorted(ctx.inventory.endpoints(), key=lambda e: e.key)
        if ep.key in health
        and matches(ep, pool=pool, provider=provider, labels=wanted, protocol=protocol)
        and (healthy is None or health[ep.key].healthy == healthy)
    ]
    groups = [SharedEgress(ip=ip, proxies=keys) for ip, keys in shared.items()]
    return ProxyList(items=items, count=len(items), shared_egress=groups)


@router.get(
    "/v1/proxies/{namespace}/{name}",
    response_model=ProxyDetail,
    responses=responses(401, 403, 404, 422),
    summary="One proxy, with its penalties",
)
async def get_proxy(ctx: Context, _client: ReaderClient, namespace: str, name: str) -> ProxyDetail:
    key = f"{namespace}/{name}"
    endpoint = ctx.inventory.get(key)
    if endpoint is None:
        raise ApiError(404, "proxy_not_found", f"no proxy {key!r}; GET /v1/proxies lists them")
    shared = shared_egress({ep.key: ctx.inventory.health(ep.key) for ep in ctx.inventory.endpoints()})
    base = proxy_out(endpoint, health=ctx.inventory.health(key), shared=shared)
    return proxy_detail(base, await ctx.discovery.penalties(key))
