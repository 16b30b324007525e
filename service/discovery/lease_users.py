"""Lease-scoped credentials: a user of its own per lease on proxies that can take one (docs/security.md).

The user is pushed to the proxy's control channel (`stacks/forward_proxy/control.py`, the endpoint's
`control`: a unix socket of a `local` proxy, or `tcp://NAME:PORT` of proxy pods, where it goes to every
address NAME resolves to, with the token of the proxy's own password: `control_targets.py`) before the
lease is answered, and only once every one of them acknowledged, with the lease's ttl:
the proxy ends it on its own at the lease's end (and cuts its connections), so a lost revoke cannot keep
access alive. A renewal moves that end; a release revokes it. The sweeper revokes the users of `tcp://`
leases this replica saw end by expiry, which is when it forgets them as a follow round's work (below); a
`local` proxy's leases are not swept: the proxy's own end comes first (the sweeper runs once a second) and
keeping them cost a tuple each (5 MiB at 500 leases a second) and a lookup and a push at each end.

Any replica can do each step: the user's name is derived from the lease id (`lease-<id>`), and the proxy
key comes with the lease record, so a release on another replica than the one that leased revokes too. The
password is never stored by the service: only the client holds it, and the proxy and the replica that
issued it a digest.

Users follow a proxy's pods: every FOLLOW_SECONDS `follow` asks each listener of a `tcp://` channel that
has live users of this replica who it is (`hello`: one small request per pod and round). A listener not
seen before with that instance (a new pod of a rollout, a container started again) gets each live user of
the proxy added by its digest, with the lease's end as the store has it now (a lease released or ended is
dropped instead). The headless Service of a proxy's pods publishes a pod before it is Ready, and a pod is
not Ready before FOLLOW_SECONDS have passed (its readiness probe's initial delay), so a new pod mostly has
the users before it takes traffic; when it has not (a loaded node, a DNS cache that outlives the delay),
the pod holds a login of a lease user it was never given until the round brings it (the proxy's
`LeaseUsers.hold`, stacks/forward_proxy/users.py) instead of a 407.
Users issued by a replica that is gone are not added again, nor are those of a `local` proxy's process
started again (its unix socket is not followed): those leases fail closed.
"""

from __future__ import annotations

import asyncio
import hashlib
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
from stacks.forward_proxy.control_client import ControlClient
from stacks.forward_proxy.users import LEASE_PREFIX

log = logging.getLogger(__name__)
PUSH_SECONDS = 2.0  # the bounded wait for a proxy's acknowledgement
SWEEP_SECONDS = 1.0
FOLLOW_SECONDS = control.FOLLOW_SECONDS  # how often listeners of channels with live users are asked
FOLLOW_CONCURRENCY = 32  # proxies followed at once
TCP = "tcp://"  # the channels followed: proxy pods, whose rollouts start new processes as a matter of course
Call = Callable[..., Awaitable[Any]]
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
    return LEASE_PREFIX.decode() + lease_id  # the prefix a new pod's hold waits for


class LeaseUsers:
    def __init__(
        self,
        *,
        inventory: Inventory,
        enabled: bool,
        new_password: Callable[[], str] = lambda: secrets.token_urlsafe(16),
        call: Call | None = None,
        resolve: Resolve = control_targets.resolve_addresses,
    ) -> None:
        self._inventory = inventory
        self._enabled = enabled
        self._new_password = new_password
        # The pushes go over connections kept per channel (a new one per push was several turns of the loop
        # per lease, and an accept in the listener): stacks/forward_proxy/control_client.py.
        self._client: ControlClient | None = None
        if call is None:
            self._client = ControlClient()
            call = self._client.call
        self._call = call
        self._resolve = resolve
        self._ends: list[tuple[float, str]] = []  # (expires_at, lease id) of its tcp:// leases
        self._issued: dict[str, dict[str, bytes]] = {}  # proxy -> lease id -> digest of its user's password
        self._reached: dict[str, set[tuple[str, str]]] = {}  # proxy -> (target, instance) holding them all

    async def close(self) -> None:
        """Close the kept control connections (at the app's end)."""
        if self._client is not None:
            await self._client.close()

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
        if not scoped:
            return {}, []
        users = {
            lease.lease_id: LeaseUser(user_of(lease.lease_id), self._new_password()) for lease, _ in scoped
        }
        for lease, chan in scoped:  # before the push: a listener `follow` finds meanwhile gets it too
            if chan.path.startswith(TCP):
                digest = hashlib.sha256(users[lease.lease_id].password.encode()).digest()
                self._issued.setdefault(lease.proxy, {})[lease.lease_id] = digest
        pushes = [
            self._push(chan, op="add", lease=lease, now=now, password=users[lease.lease_id].password)
            for lease, chan in scoped
        ]
        failed = [
            lease for (lease, _), ok in zip(scoped, await asyncio.gather(*pushes), strict=True) if not ok
        ]
        for lease in failed:
            users.pop(lease.lease_id)
            self._forget(lease)
        return users, failed

    async def extend(self, lease: LeaseRecord, *, now: float) -> None:
        """Move the user's end with a renewal; a failed push leaves its old end (fail closed)."""
        chan = self.channel(lease.proxy)
        if chan is not None:
            await self._push(chan, op="renew", lease=lease, now=now)

    async def revoke(self, lease: LeaseRecord) -> None:
        """Best effort: the proxy ends the user at the lease's end anyway."""
        self._forget(lease)
        chan = self.channel(lease.proxy)
        if chan is not None:
            await self._send(chan, {"op": "revoke", "user": user_of(lease.lease_id)}, lease=lease)

    async def sweep(self, *, now: float, lookup: Lookup) -> None:
        """Revoke the users of `tcp://` leases that ended by expiry and forget them (a renewal elsewhere only
        moves them on)."""
        while self._ends and self._ends[0][0] <= now:
            _, lease_id = heapq.heappop(self._ends)
            lease = await lookup(lease_id, now=now)
            if lease is not None and not lease.released and lease.expires_at > now:
                heapq.heappush(self._ends, (lease.expires_at, lease_id))  # renewed by another replica
            elif lease is not None:
                await self.revoke(lease)

    async def follow(self, *, now: float, lookup: Lookup) -> None:
        """Add this replica's live users to each listener that may not have them (module docstring)."""
        limit = asyncio.Semaphore(FOLLOW_CONCURRENCY)

        async def one(proxy: str) -> None:
            async with limit:
                await self._follow(proxy, now=now, lookup=lookup)

        await asyncio.gather(*(one(proxy) for proxy in list(self._issued)))

    async def _follow(self, proxy: str, *, now: float, lookup: Lookup) -> None:
        chan = self.channel(proxy)
        if chan is None or not self._issued.get(proxy):
            self._issued.pop(proxy, None)
            self._reached.pop(proxy, None)
            return
        found = [
            (target, instance)
            for target in await control_targets.targets(chan.path, resolve=self._resolve, wait=PUSH_SECONDS)
            if (instance := await self._hello(target, chan)) is not None
        ]
        reached = self._reached.setdefault(proxy, set())
        reached.intersection_update(found)  # a listener gone is forgotten
        fresh = [pair for pair in found if pair not in reached]
        if not fresh:
            return
        live = await self._live(proxy, now=now, lookup=lookup)
        for target, instance in fresh:
            adds = [self._send_one(target, add, lease=lease, password=chan.password) for lease, add in live]
            if all(await asyncio.gather(*adds)):
                reached.add((target, instance))

    async def _live(
        self, proxy: str, *, now: float, lookup: Lookup
    ) -> list[tuple[LeaseRecord, dict[str, Any]]]:
        """The proxy's users of this replica whose leases live, each with the `add` that restores it; the
        others are dropped."""
        issued = self._issued.get(proxy, {})
        live = []
        for lease_id, digest in list(issued.items()):
            lease = await lookup(lease_id, now=now)
            if lease is None or lease.released or lease.expires_at <= now:
                issued.pop(lease_id, None)
                continue
            request = {"op": "add", "user": user_of(lease_id), "digest": digest.hex()}
            live.append((lease, request | {"ttl": lease.expires_at - now}))
        return live

    async def _hello(self, target: str, channel: Channel) -> str | None:
        try:
            answer = await self._call(target, {"op": "hello"}, wait=PUSH_SECONDS, password=channel.password)
        except control.ControlError:
            return None  # not listening (yet), or a proxy from before `hello`: asked again next round
        instance = answer.get("instance") if isinstance(answer, dict) else None
        return instance if isinstance(instance, str) else None

    def _forget(self, lease: LeaseRecord) -> None:
        issued = self._issued.get(lease.proxy)
        if issued is not None:
            issued.pop(lease.lease_id, None)
            if not issued:
                self._issued.pop(lease.proxy, None)
                self._reached.pop(lease.proxy, None)

    def _new_user(self, lease: LeaseRecord) -> LeaseUser:
        return LeaseUser(username=user_of(lease.lease_id), password=self._new_password())

    async def _push(self, channel: Channel, *, op: str, lease: LeaseRecord, now: float, **extra: Any) -> bool:
        """True when every listener acknowledged; the sweep remembers a `tcp://` lease once any did."""
        ttl = lease.expires_at - now
        if ttl <= 0:
            return False
        request = {"op": op, "user": user_of(lease.lease_id), "ttl": ttl, **extra}
        acknowledged = await self._send(channel, request, lease=lease)
        if any(acknowledged) and channel.path.startswith(TCP):
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
