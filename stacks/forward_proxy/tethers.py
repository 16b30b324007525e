"""Connections follow their lease user: a revoke cuts them at once, the user's end within moments of it.

A lease user gates more than new logins: a tunnel opened under a lease must not outlive it. Each connection
that logged in as a lease user is tethered to that user here; `LeaseUsers` tells every change of a user
(added, renewed, revoked), and a user with tethered connections has one timer, set for its end. When the
timer fires or a change arrives, the user's end is read again: gone (revoked, ended) cuts every connection
tethered to it, both sides at once; a later end (a renewal) sets the timer anew. One timer per user with
open connections, none per connection and no sweep; users without connections cost nothing here.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from stacks.forward_proxy.users import LeaseUsers


class Cuttable(Protocol):
    def cut(self) -> None:
        """Close the connection now, client and upstream side, wherever it is in its request."""


class Tethers:
    def __init__(self, users: LeaseUsers) -> None:
        self._users = users
        self._connections: dict[bytes, set[Cuttable]] = {}
        self._timers: dict[bytes, asyncio.TimerHandle] = {}
        users.watcher = self.changed

    def attach(self, user: bytes, connection: Cuttable) -> None:
        """`connection` logged in as `user`: it ends when the user does."""
        connections = self._connections.setdefault(user, set())
        connections.add(connection)
        if len(connections) == 1:
            self._follow(user)

    def detach(self, user: bytes, connection: Cuttable) -> None:
        """`connection` closed on its own: forget it (and the user's timer with its last connection)."""
        connections = self._connections.get(user)
        if connections is None:
            return
        connections.discard(connection)
        if not connections:
            del self._connections[user]
            self._disarm(user)

    def changed(self, user: bytes) -> None:
        """`LeaseUsers`' watcher: the user was added, renewed or revoked."""
        if user in self._connections:
            self._follow(user)

    def __len__(self) -> int:
        """Users with open connections (each with its timer)."""
        return len(self._connections)

    def _follow(self, user: bytes) -> None:
        """Cut the user's connections if it has ended, else (re)set its timer for its end."""
        self._disarm(user)
        end = self._users.end(user)
        if end is None:
            self._cut(user)
            return
        delay = max(0.0, end - self._users.clock())
        self._timers[user] = asyncio.get_running_loop().call_later(delay, self._follow, user)

    def _disarm(self, user: bytes) -> None:
        timer = self._timers.pop(user, None)
        if timer is not None:
            timer.cancel()

    def _cut(self, user: bytes) -> None:
        for connection in self._connections.pop(user, set()):
            connection.cut()
