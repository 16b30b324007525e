"""Lease-scoped credentials: a user of its own per lease on proxies that can take one (docs/security.md).

The user is pushed to the proxy's control channel (`stacks/forward_proxy/control.py`, a unix socket the
`local` program exports as the endpoint's `control`) before the lease is answered, with the lease's ttl:
the proxy ends it on its own at the lease's end, so a lost revoke cannot keep access alive. A renewal moves
that end; a release revokes it; the sweeper revokes the users of leases this replica saw end by expiry.

Any replica can do each step: the user's name is derived from the lease id (`lease-<id>`), and the proxy
key comes with the lease record, so a release on another replica than the one that leased revokes too. The
password is never stored by the service: only the client and the proxy (as a digest) hold it.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from service.discovery.store import LeaseRecord
from service.inventory import Inventory
from stacks.forward_proxy import control

log = logging.getLogger(__name__)
PUSH_SECONDS = 2.0  # the bounded wait for a proxy's acknowledgement
SWEEP_SECONDS = 1.0
Call = Callable[..., Awaitable[None]]
Lookup = Callable[..., Awaitable[LeaseRecord | None]]


@dataclass(frozen=True)
class LeaseUser:
    username: str
    password: str = field(repr=False)


def user_of(lease_id: str) -> str:
    return f"lease-{lease_id}"


class LeaseUsers:
    def __init__(
        self,
        *,
        inventory: Inventory,
        enabled: bool,
        new_password: Callable[[], str] = lambda: secrets.token_urlsafe(16),
        call: Call = control.call,
    ) -> None:
        self._inventory = inventory
        self._enabled = enabled
        self._new_password = new_password
        self._call = call
        self._ends: list[tuple[float, str]] = []  # (expires_at, lease id) of leases this replica touched

    def channel(self, proxy: str) -> str | None:
        """The proxy's control channel when its leases get their own users; None: its own credentials."""
        endpoint = self._inventory.get(proxy)
        return endpoint.control if self._enabled and endpoint is not None else None

    async def issue(
        self, leases: Iterable[LeaseRecord], *, now: float
    ) -> tuple[dict[str, LeaseUser], list[LeaseRecord]]:
        """Push a user for each lease on a scoped proxy, all at once: (users by lease id, leases whose push
        failed: they must not be answered)."""
        scoped = [(lease, path) for lease in leases if (path := self.channel(lease.proxy)) is not None]
        users = {
            lease.lease_id: LeaseUser(user_of(lease.lease_id), self._new_password()) for lease, _ in scoped
        }
        pushes = [
            self._push(path, op="add", lease=lease, now=now, password=users[lease.lease_id].password)
            for lease, path in scoped
        ]
        failed = [
            lease for (lease, _), ok in zip(scoped, await asyncio.gather(*pushes), strict=True) if not ok
        ]
        for lease in failed:
            users.pop(lease.lease_id)
        return users, failed

    async def extend(self, lease: LeaseRecord, *, now: float) -> None:
        """Move the user's end with a renewal; a failed push leaves its old end (fail closed)."""
        path = self.channel(lease.proxy)
        if path is not None:
            await self._push(path, op="renew", lease=lease, now=now)

    async def revoke(self, lease: LeaseRecord) -> None:
        """Best effort: the proxy ends the user at the lease's end anyway."""
        path = self.channel(lease.proxy)
        if path is not None:
            await self._send(path, {"op": "revoke", "user": user_of(lease.lease_id)}, lease=lease)

    async def sweep(self, *, now: float, lookup: Lookup) -> None:
        """Revoke the users of leases that ended by expiry (a renewal elsewhere only moves them on)."""
        while self._ends and self._ends[0][0] <= now:
            _, lease_id = heapq.heappop(self._ends)
            lease = await lookup(lease_id, now=now)
            if lease is not None and not lease.released and lease.expires_at > now:
                heapq.heappush(self._ends, (lease.expires_at, lease_id))  # renewed by another replica
            elif lease is not None:
                await self.revoke(lease)

    def _new_user(self, lease: LeaseRecord) -> LeaseUser:
        return LeaseUser(username=user_of(lease.lease_id), password=self._new_password())

    async def _push(self, path: str, *, op: str, lease: LeaseRecord, now: float, **extra: Any) -> bool:
        ttl = lease.expires_at - now
        if ttl <= 0:
            return False
        request = {"op": op, "user": user_of(lease.lease_id), "ttl": ttl, **extra}
        ok = await self._send(path, request, lease=lease)
        if ok:
            heapq.heappush(self._ends, (lease.expires_at, lease.lease_id))
        return ok

    async def _send(self, path: str, request: dict[str, Any], *, lease: LeaseRecord) -> bool:
        try:
            await self._call(path, request, wait=PUSH_SECONDS)
        except control.ControlError as exc:
            log.warning(
                "lease user %s on %s: %s",
                request["op"],
                lease.proxy,
                exc,
                extra={"fields": {"proxy": lease.proxy, "lease": lease.lease_id}},
            )
            return False
        return True
