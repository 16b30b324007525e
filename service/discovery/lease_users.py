"""Lease-scoped credentials: a user of its own per lease on proxies that can take one (docs/security.md).

The user is pushed to the proxy's control channel (`stacks/forward_proxy/control.py`, the endpoint's
`control`: a unix socket of a `local` proxy, or `tcp://NAME:PORT` of proxy pods, where it goes to every
address NAME resolves to, with the token of the proxy's own password: `control_targets.py`) before the
lease is answered, and only once every one of them acknowledged, with the lease's ttl:
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

from service.discovery import control_targets
from service.discovery.control_targets import Resolve
from service.discovery.store import LeaseRecord
from service.inventory import Inventory
from stacks.forward_proxy import control

log = logging.getLogger(__name__)
PUSH_SECONDS = 2.0  # the bounded wait for a proxy's acknowledgement
SWEEP_SECONDS = 1.0
Call = Callable[..., Awaitable[None]]
Lookup = Callable[..., Awaitable[LeaseRecord | None]]


@dataclass(frozen=True)
class Channel:
    """A proxy's control channel and the proxy's own password (a `tcp://` channel's token derives from it)."""

    path: str
    password: str | None = field(repr=False)


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
        resolve: Resolve = control_targets.resolve_addresses,
    ) -> None:
        self._inventory = inventory
        self._enabled = enabled
        self._new_password = new_password
        self._call = call
        self._resolve = resolve
        self._ends: list[tuple[float, str]] = []  # (expires_at, lease id) of leases this replica touched

    def channel(self, proxy: str) -> Channel | None:
        """The proxy's control channel when its leases get their own users; None: its own credentials."""
        endpoint = self._inventory.get(proxy)
        if not self._enabled or endpoint is None or endpoint.control is None:
            return None
        return Channel(path=endpoint.control, password=endpoint.password)

    async def issue(
        self, leases: Iterable[LeaseRecord], *, now: float
    ) -> tuple[dict[str, LeaseUser], list[LeaseRecord]]:
        """Push a user for each lease on a scoped proxy, all at once: (users by lease id, leases whose push
        failed: they must not be answered)."""
        scoped = [(lease, chan) for lease in leases if (chan := self.channel(lease.proxy)) is not None]
        users = {
            lease.lease_id: LeaseUser(user_of(lease.lease_id), self._new_password()) for lease, _ in scoped
        }
        pushes = [
            self._push(chan, op="add", lease=lease, now=now, password=users[lease.lease_id].password)
            for lease, chan in scoped
        ]
        failed = [
            lease for (lease, _), ok in zip(scoped, await asyncio.gather(*pushes), strict=True) if not ok
        ]
        for lease in failed:
            users.pop(lease.lease_id)
        return users, failed

    async def extend(self, lease: LeaseRecord, *, now: float) -> None:
        """Move the user's end with a renewal; a failed push leaves its old end (fail closed)."""
        chan = self.channel(lease.proxy)
        if chan is not None:
            await self._push(chan, op="renew", lease=lease, now=now)

    async def revoke(self, lease: LeaseRecord) -> None:
        """Best effort: the proxy ends the user at the lease's end anyway."""
        chan = self.channel(lease.proxy)
        if chan is not None:
            await self._send(chan, {"op": "revoke", "user": user_of(lease.lease_id)}, lease=lease)

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

    async def _push(self, channel: Channel, *, op: str, lease: LeaseRecord, now: float, **extra: Any) -> bool:
        """True when every listener acknowledged; the sweep remembers the lease once any did."""
        ttl = lease.expires_at - now
        if ttl <= 0:
            return False
        request = {"op": op, "user": user_of(lease.lease_id), "ttl": ttl, **extra}
        acknowledged = await self._send(channel, request, lease=lease)
        if any(acknowledged):
            heapq.heappush(self._ends, (lease.expires_at, lease.lease_id))
        return bool(acknowledged) and all(acknowledged)

    async def _send(self, channel: Channel, request: dict[str, Any], *, lease: LeaseRecord) -> list[bool]:
        """Send to each listener of the channel at once: whether each acknowledged (none: nobody listens)."""
        targets = await control_targets.targets(channel.path, resolve=self._resolve, wait=PUSH_SECONDS)
        if not targets:
            self._warn(request, lease=lease, error=f"{channel.path}: no address to send to")
        sends = [
            self._send_one(target, request, lease=lease, password=channel.password) for target in targets
        ]
        return list(await asyncio.gather(*sends))

    async def _send_one(
        self, target: str, request: dict[str, Any], *, lease: LeaseRecord, password: str | None
    ) -> bool:
        try:
            await self._call(target, request, wait=PUSH_SECONDS, password=password)
        except control.ControlError as exc:
            self._warn(request, lease=lease, error=str(exc))
            return False
        return True

    @staticmethod
    def _warn(request: dict[str, Any], *, lease: LeaseRecord, error: str) -> None:
        log.warning(
            "lease user %s on %s: %s",
            request["op"],
            lease.proxy,
            error,
            extra={"fields": {"proxy": lease.proxy, "lease": lease.lease_id}},
        )
