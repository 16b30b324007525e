"""How a child Proxy is named and labelled, and how a child is recognised again (after a restart too).

Membership lives in the children themselves: their labels (pool, placement, birth time, which child they
replace) and their spec (the port) reach the stack config, and the stack echoes them back as the output
`appliedProxies`, which the controller reads at start and hands to `track()`.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass

from stacks.models import Proxy

POOL_LABEL = "crawl.example.com/pool"
PLACEMENT_LABEL = "crawl.example.com/pool-placement"
BORN_LABEL = "crawl.example.com/pool-born"  # epoch seconds: a child's age survives restarts
REPLACES_LABEL = "crawl.example.com/pool-replaces"
TOKEN_LENGTH = 5
# Programs name resources `px-<namespace>-<name>` in at most 60 characters (gcp adds `-ipv4`).
PHYSICAL_BUDGET = 60 - len("px-")


def child_name(*, pool: str, namespace: str, token: str) -> str:
    """`<pool>-<token>`, the pool's part cut so `px-<namespace>-<name>` fits its physical budget."""
    room = min(63, PHYSICAL_BUDGET - len(namespace) - 1) - TOKEN_LENGTH - 1
    head = pool[: max(room, 1)].rstrip("-") or "p"
    return f"{head}-{token}"


def new_token(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(TOKEN_LENGTH))


@dataclass(frozen=True)
class Member:
    """A child as its labels describe it."""

    proxy: Proxy
    pool: str  # the pool's key, ns/name
    placement: str
    born: float
    replaces: str | None

    @property
    def name(self) -> str:
        return self.proxy.metadata.name

    @property
    def key(self) -> str:
        return self.proxy.key


def member_of(proxy: Proxy) -> Member | None:
    """The pool membership a Proxy's labels record, or None for a Proxy of no pool."""
    labels = proxy.metadata.labels
    pool = labels.get(POOL_LABEL)
    if not pool:
        return None
    born = labels.get(BORN_LABEL, "0")
    return Member(
        proxy=proxy,
        pool=f"{proxy.metadata.namespace}/{pool}",
        placement=labels.get(PLACEMENT_LABEL, ""),
        born=float(born) if re.fullmatch(r"[0-9]{1,12}", born) else 0.0,
        replaces=labels.get(REPLACES_LABEL) or None,
    )
