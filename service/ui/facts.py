"""What one proxy row says beyond the index: its status in words, health, leases and bans (never credentials).

Only the rows of the page being shown are read this way (a status decode, a health lookup each); leases
and bans come from the discovery store, as `/v1/proxies` reads them.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from service.api.deps import ApiContext
from service.discovery.store import LeaseRecord, Penalty
from service.inventory import Health
from stacks.models import ProxyStatus


@dataclass(frozen=True)
class Facts:
    key: str
    status: ProxyStatus | None
    health: Health
    shared_with: list[str]
    leases: list[LeaseRecord]
    bans: list[Penalty]
    sessions: int = 0  # sticky sessions bound to it now

    @property
    def not_ready(self) -> tuple[str, str] | None:
        """(reason, message) of the Ready condition when it is not True."""
        if self.status is None:
            return None
        cond = next((c for c in self.status.conditions if c.type == "Ready"), None)
        if cond is None or cond.status == "True":
            return None
        return cond.reason, cond.message


async def leases_by_proxy(ctx: ApiContext, *, now: float) -> dict[str, list[LeaseRecord]]:
    """The active leases of every client in the tokens file, by proxy."""
    found: dict[str, list[LeaseRecord]] = defaultdict(list)
    for name in ctx.authenticator.client_names():
        for lease in await ctx.discovery.store.active_leases(name, now=now):
            found[lease.proxy].append(lease)
    return found


async def facts_of(
    ctx: ApiContext, keys: list[str], *, leases: dict[str, list[LeaseRecord]], shared: dict[str, list[str]]
) -> list[Facts]:
    out = []
    sessions = await ctx.discovery.store.sessions_on(keys, now=time.time()) if keys else {}
    for key in keys:
        health = ctx.inventory.health(key)
        status = ctx.status.published(key) if ctx.status is not None else None
        others = [k for k in shared.get(health.egress_ip or "", []) if k != key]
        bans = await ctx.discovery.penalties(key) if ctx.inventory.get(key) is not None else []
        out.append(
            Facts(
                key=key,
                status=status,
                health=health,
                shared_with=others,
                leases=leases.get(key, []),
                bans=bans,
                sessions=sessions.get(key, 0),
            )
        )
    return out


def now() -> float:
    return time.time()
