"""Who may use the proxy: its static credentials, and per-lease users added and revoked at run time.

Lease users come from the discovery service over the control channel (`control.py`). Each carries its own
end: past it the user no longer authenticates, whether or not a revoke arrives, so a lost revoke cannot keep
access alive. Passwords are kept as SHA-256 digests: they are 128-bit random strings, so a slow hash would
add nothing but cost per request. Deadlines run on the monotonic clock: no agreement with the service's
wall clock is needed (the service sends a ttl, not a date).

A user's end and its revoke also reach the connections it opened: every change of a user is told to the
`watcher` (`tethers.Tethers`, which cuts them), and `Gate.login` says which kind of user logged in.

A new instance on a followed channel (a proxy pod's tcp channel: the service adds its live users to each new
instance within a follow round) is `hold`-ing for a while: a login of a lease user it has never seen waits
(`arrival`) for the user to be added, then is judged again. Without it a pod that took traffic before the
round reached it answered 407 to a live lease (seen on the test node under load). A user it has seen (added,
then revoked or ended) and a wrong password of a known user are refused at once; after the hold nothing waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from stacks.forward_proxy.config import ProxyConfig

MAX_USERS = 100_000  # bounded memory: far above the leases one proxy can hold at once
LEASE_PREFIX = b"lease-"  # the service names each lease's user lease-<id> (service/discovery/lease_users.py)


class UsersFull(Exception):
    """MAX_USERS live users already: the service is leaking users or something else writes them."""


def _digest(password: bytes) -> bytes:
    return hashlib.sha256(password).digest()


def _unwatched(user: bytes) -> None:
    pass


@dataclass
class LeaseUsers:
    clock: Callable[[], float] = time.monotonic
    watcher: Callable[[bytes], None] = _unwatched  # told each user added, renewed or revoked
    # Who this process is: a proxy started again (a new pod, a restart) knows no users, and says so by a new
    # instance (the control channel's `hello`), so the service pushes its live users there again.
    instance: str = field(default_factory=lambda: secrets.token_hex(8))
    _users: dict[bytes, tuple[bytes, float]] = field(default_factory=dict)
    _hold_until: float = 0.0  # on `clock`; 0: not holding
    _seen: set[bytes] = field(default_factory=set)  # users added during the hold
    _waiting: dict[bytes, list[asyncio.Future[None]]] = field(default_factory=dict)

    def hold(self, seconds: float) -> None:
        """Hold logins of unseen lease users for `seconds` from now (the channel opened)."""
        self._hold_until = self.clock() + seconds

    def holds(self, user: bytes) -> bool:
        """Is a refused login of `user` worth waiting on: a lease user never seen, while holding?"""
        if self._hold_until and self.clock() >= self._hold_until:
            self._hold_until, self._seen = 0.0, set()  # over for good: nothing to remember
        return bool(self._hold_until) and user.startswith(LEASE_PREFIX) and user not in self._seen

    async def arrival(self, user: bytes) -> None:
        """Until `user` is added, or the hold ends."""
        left = self._hold_until - self.clock()
        if left <= 0:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(user, []).append(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, left)
        finally:
            waiters = self._waiting.get(user, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiting.pop(user, None)

    def add(self, user: str, password: str, *, ttl: float) -> None:
        """Admit `user` for `ttl` seconds from now (a second add replaces the password and the end)."""
        self.add_digest(user, _digest(password.encode()), ttl=ttl)

    def add_digest(self, user: str, digest: bytes, *, ttl: float) -> None:
        """`add` for a password known by its SHA-256 digest only (the service's copy of a live user)."""
        if len(self._users) >= MAX_USERS:
            self._purge()
            if len(self._users) >= MAX_USERS:
                raise UsersFull(f"{MAX_USERS} lease users are live")
        key = user.encode()
        self._users[key] = (digest, self.clock() + ttl)
        self.watcher(key)
        if self._hold_until:
            self._seen.add(key)
            for waiter in self._waiting.pop(key, []):
                if not waiter.done():
                    waiter.set_result(None)

    def renew(self, user: str, *, ttl: float) -> bool:
        """Move a live user's end to `ttl` seconds from now; False when it is unknown or already ended."""
        key = user.encode()
        entry = self._users.get(key)
        if entry is None or entry[1] <= self.clock():
            self._users.pop(key, None)
            return False
        self._users[key] = (entry[0], self.clock() + ttl)
        self.watcher(key)
        return True

    def revoke(self, user: str) -> None:
        key = user.encode()
        self._users.pop(key, None)  # idempotent: a retried revoke is no error
        self.watcher(key)

    def end(self, user: bytes) -> float | None:
        """When a live user ends (on `clock`); None when it is unknown, revoked or already ended."""
        entry = self._users.get(user)
        if entry is None or entry[1] <= self.clock():
            return None
        return entry[1]

    def check(self, user: bytes, password: bytes) -> bool:
        entry = self._users.get(user)
        if entry is None:
            return False
        if entry[1] <= self.clock():
            del self._users[user]  # ended on its own
            return False
        return hmac.compare_digest(_digest(password), entry[0])

    def __len__(self) -> int:
        return len(self._users)

    def _purge(self) -> None:
        now = self.clock()
        for user in [u for u, (_, end) in self._users.items() if end <= now]:
            del self._users[user]


class Login(enum.Enum):
    """Who a login turned out to be: what decides whether its connection follows a lease."""

    REFUSED = "refused"
    OPEN = "open"  # no authentication at all
    STATIC = "static"  # the proxy's own credentials (the prober's, the operators'): never cut
    LEASE = "lease"  # a lease user: its connections end with it


@dataclass(frozen=True)
class Gate:
    """The one authentication decision, shared by HTTP Basic and SOCKS5 user/password."""

    config: ProxyConfig
    users: LeaseUsers

    @property
    def open(self) -> bool:
        """No static credentials: no authentication at all (loopback only, see the model's rules)."""
        return self.config.username is None

    def login(self, user: bytes, password: bytes) -> Login:
        if self.open:
            return Login.OPEN
        expected = f"{self.config.username}:{self.config.password}".encode()
        static = hmac.compare_digest(user + b":" + password, expected)
        lease = self.users.check(user, password)
        if static:
            return Login.STATIC
        return Login.LEASE if lease else Login.REFUSED
