"""How many connections are open, per source and in all: the caps that keep one client (or a crowd) from
holding every file descriptor of the proxy.

A source is a client's address; an IPv6 client counts by its /64, which one host or one customer usually
holds whole (otherwise a single machine could take a new address per connection). The total cap must fit
the process's descriptor limit: each connection holds two (client and upstream), and a reserve stays for
the listener, the control channel and name resolution. At start the soft limit is raised towards the hard
one as far as the cap needs, and the cap is lowered when even the hard limit cannot carry it.
"""

from __future__ import annotations

import enum
import ipaddress
import resource
from dataclasses import dataclass, field

from stacks.egress import canonical

RESERVE = 64  # descriptors kept for the listener, the control channel, the log and resolving
PER_CONNECTION = 2  # the client's socket and the upstream's


class Full(enum.Enum):
    """Why a new connection was turned away."""

    SOURCE = "source"  # its source already holds `per_source` connections
    TOTAL = "total"  # the proxy already holds `total`


def source_of(peer: str) -> str:
    """The key a client counts under: its (IPv4-mapped: IPv4) address, or its IPv6 /64."""
    address = canonical(peer)
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@dataclass
class Occupancy:
    per_source: int
    total: int
    _open: dict[str, int] = field(default_factory=dict)
    _count: int = 0

    def enter(self, source: str) -> Full | None:
        """Count a new connection from `source`; why not (and nothing counted) when a cap is reached."""
        if self._count >= self.total:
            return Full.TOTAL
        held = self._open.get(source, 0)
        if held >= self.per_source:
            return Full.SOURCE
        self._open[source] = held + 1
        self._count += 1
        return None

    def leave(self, source: str) -> None:
        """A connection from `source` that `enter` counted has closed."""
        held = self._open.pop(source) - 1
        if held:
            self._open[source] = held
        self._count -= 1

    def __len__(self) -> int:
        return self._count


def fit_descriptors(total: int) -> int:
    """Raise the soft descriptor limit as far as `total` connections need (never past the hard limit);
    the total that fits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = total * PER_CONNECTION + RESERVE
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass  # keep the soft limit we have
    return max(1, min(total, (soft - RESERVE) // PER_CONNECTION))


def raise_to_hard() -> int:
    """The shared listener's descriptors: the soft limit raised to the hard one (every port holds one, every
    connection two); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass  # keep the soft limit we have
    return soft
