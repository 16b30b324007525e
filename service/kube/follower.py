"""A follower's inventory from the cluster, changed by the watch events, not by re-reading the fleet.

A follower serves what the leader wrote: each Proxy's `status.address`, its `Healthy` condition and egress
IP, and the credentials Secret the leader writes for it. The watched copy (`ClusterCache`) and the
credentials reader name each Proxy whose object or Secret changed (`mark`, from their watch threads, after
their copy changed); `apply` judges only those: one model validation per changed Proxy. Before, every poll
validated every Proxy on the event loop: 0.65-0.75 s of every second at 10,000, with discovery frozen
meanwhile.

`mark_all` judges every watched Proxy again, and every key the inventory holds: what a new follower does
first (the inventory may hold what this replica published as the leader). A key the cache no longer holds
leaves the inventory, so a DELETED event and a re-list after a watch gap or a 410 (which drops the Proxies
gone meanwhile, and marks them) come out right. `apply` works in slices of `budget` seconds, so the event
loop serves leases between two slices of a long pass; the inventory is loaded once a pass over everything
found nothing left and the first list is in.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from service.inventory import Health, HealthState, Inventory, ProxyEndpoint
from service.kube.credentials import CredentialsReader, followed_output
from service.kube.proxy_object import ProxyObject
from service.reporter import endpoint_of
from service.sources.kubernetes import KubernetesSource
from stacks.models import Proxy
from stacks.models.conditions import ConditionType


class FollowedInventory:
    def __init__(
        self,
        *,
        source: KubernetesSource,
        credentials: CredentialsReader,
        inventory: Inventory,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.source, self.credentials, self.inventory = source, credentials, inventory
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._whole = True  # a pass over everything is due (the first one)
        self._pass: set[str] = set()  # what the pass over everything has yet to judge
        self._passed = False  # a pass over everything ended (the inventory may be loaded)
        self.judged = 0  # Proxies judged so far (tests, the bench)

    @classmethod
    def attach(
        cls, *, source: KubernetesSource, credentials: CredentialsReader, inventory: Inventory
    ) -> FollowedInventory:
        """One that the source's watched copy and the credentials reader tell about each change."""
        followed = cls(source=source, credentials=credentials, inventory=inventory)
        source.cache.on_object = followed.mark
        credentials.on_change = followed.mark
        return followed

    def mark(self, key: str) -> None:
        """This Proxy's object or Secret changed (any thread). While a whole pass is due (always on a
        leader, whose term's end asks for one) the pass judges it anyway: not kept (a leader's set of
        every key it was told about was 0.75 MiB at 10,000)."""
        with self._lock:
            if not self._whole:
                self._pending.add(key)

    def mark_all(self) -> None:
        """Judge every watched Proxy and every key of the inventory again at the next `apply` (which takes
        every key again: what was pending is dropped)."""
        with self._lock:
            self._whole = True
            self._pending.clear()
            self._pass.clear()

    @property
    def pending(self) -> bool:
        return self._whole or bool(self._pending)

    def apply(self, *, budget: float = 0.01) -> bool:
        """Judge what changed for about `budget` seconds (one Proxy at least); True when nothing is left."""
        self._take_whole()
        deadline = self._clock() + budget
        while True:
            with self._lock:
                if not self._pending:
                    break
                key = self._pending.pop()
                self._pass.discard(key)
                if not self._pass and not self._whole:
                    self._passed = True
            self._judge(key)
            if self._clock() >= deadline:
                break
        if self._passed and not self.inventory.loaded and self.source.desired_state_synced():
            self.inventory.mark_loaded()
        return not self.pending

    def _take_whole(self) -> None:
        with self._lock:
            if not self._whole:
                return
            self._whole = False
        keys = {obj.key for obj in self.source.objects()} | {e.key for e in self.inventory.endpoints()}
        with self._lock:
            self._pending |= keys
            self._pass = set(keys)
            if not keys:
                self._passed = True

    def _judge(self, key: str) -> None:
        self.judged += 1
        obj = self.source.object(key)
        found = None if obj is None else self._followed(obj)
        if found is None:
            self.inventory.remove(key)
            return
        endpoint, health = found
        if self.inventory.get(key) != endpoint:
            self.inventory.upsert(endpoint)
        seen = self.inventory.health(key)
        if seen.state is not health.state or seen.egress_ip != health.egress_ip:
            self.inventory.set_health(key, health)

    def _followed(self, obj: ProxyObject) -> tuple[ProxyEndpoint, Health] | None:
        """What discovery serves of this Proxy as the leader wrote it, None when it serves nothing."""
        status: dict[str, Any] = obj.status
        address = status.get("address") or {}
        if obj.deleting or not address.get("host"):
            return None
        try:
            proxy = Proxy.model_validate(obj.body)
        except ValidationError:
            return None
        creds = self.credentials.credentials(obj.key) or {}
        if proxy.spec.auth.mode != "none" and not creds.get("password"):
            return None  # its credentials Secret is not here yet: handed out now, it would answer 407
        out = followed_output(address, creds)
        endpoint = endpoint_of(proxy, stack=status.get("stack"), out=out, creds=creds)
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        healthy = conditions.get(ConditionType.HEALTHY) == "True"
        egress = sys.intern(str(status["egressIP"])) if status.get("egressIP") else None
        state = HealthState.healthy if healthy else HealthState.unhealthy
        return endpoint, Health(state=state, egress_ip=egress)
