"""The in-cluster mode: Proxy objects in, leader election, status and events back to the cluster.

Every replica watches (the Kubernetes source, the credentials Secrets) and serves discovery. The replica
that holds the Lease also reconciles and probes: each term of leadership gets a fresh `Controller` on the
shared source, board and inventory; losing the Lease stops that term cleanly (the queue closes, running
`pulumi` children get SIGINT) before the renew deadline runs out. A follower's inventory comes from the
cluster: each Proxy's `status.address` and `Healthy` condition, and the credentials Secret the leader
writes for it, judged as the watch events name them (service/kube/follower.py). Status and Events are
written from the board, only by the leader (only its board changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from kubernetes.client import ApiClient
from pydantic import ValidationError

from automation.deletion_budget import DeletionBudget, HeldDeletion
from automation.engine import Engine, Term
from service.config import OperatorSettings
from service.controller import Controller
from service.deletions import Allowances
from service.inventory import Inventory, ProxyEndpoint
from service.kube.credentials import Credentials, CredentialsReader, CredentialsWriter, shared_control
from service.kube.credentials_publisher import CredentialsPublisher
from service.kube.events import EventRecorder
from service.kube.follower import FollowedInventory
from service.kube.heartbeat import OperationsHeartbeat
from service.kube.holder import lease_holder_gone
from service.kube.leader import LeaderElector
from service.kube.pools import ClusterPools
from service.kube.refs import ProxyRef
from service.kube.settings import KubeSettings
from service.kube.status_writer import StatusWriter
from service.kube.summary import SummaryPublisher, SummaryReader, SummaryTask
from service.pools.history import PoolHistory
from service.pools.signals import PoolSignals
from service.sources.kubernetes import KubernetesSource
from service.status import Event, StatusBoard
from service.status_view import ClusterStatus, ReplicaStatus
from stacks.models import Condition
from stacks.models.conditions import ConditionType

log = logging.getLogger(__name__)

SYNC_TIMEOUT = 60.0  # the first list of every watched kind; then the service runs and says what is missing
TERM_GRACE = 10.0  # a term's children get this long after SIGINT before they are killed
FOLLOW_SLICE = 0.01  # a follower judges changed Proxies this long at a time, then serves the event loop


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed while a watch thread still ran
        loop.call_soon_threadsafe(callback)


class ClusterMode:
    """What `serve` runs in a cluster: the same face as a `Controller` to the API and the health sink."""

    def __init__(
        self,
        *,
        settings: OperatorSettings,
        kube: KubeSettings,
        api: ApiClient,
        inventory: Inventory,
    ) -> None:
        self.settings, self.kube, self.api, self.inventory = settings, kube, api, inventory
        config = dataclasses.replace(
            settings.engine_config(),
            # Stack locks record the machine's host name (what the CLI writes), not the identity: in a pod the
            # two are the pod's name; where they differ (replicas sharing a host), a lock of this host is
            # judged by its pid, never taken for another replica's (the fault campaign's finding).
            hostname=socket.gethostname(),
            foreign_lock_gone=functools.partial(lease_holder_gone, api, kube),
            fenced=True,  # operations only inside a leadership term; reads anywhere
            # A term's calls in an engine host, gone when idle (automation/engine/hosted.py); the host's own
            # end well inside the term's, so it is gone before this process would kill it.
            host_idle_seconds=settings.engine_host_idle_seconds,
            host_nice=settings.engine_host_nice,
            host_grace=0.6 * min(TERM_GRACE, kube.renew_deadline_seconds),
            probe_pods=kube.probe_pods(settings.listen_port),
        )
        # Calls outside a term (the API's /v1/stacks) in a reads-only engine host; a term's in its own.
        self.engine = Engine(config).reads_in_host()
        self.engine.prepare()  # the CLI's version read now: a new term's first read does not wait for it
        self.allowances = Allowances()  # deletion allowances outlive a term: a new leader honours them
        self.term: Term | None = None
        self.heartbeat = OperationsHeartbeat(
            api, kube, grace=TERM_GRACE, busy=self._busy, on_renewed=self._extend_term
        )
        self.status = StatusBoard()
        # What a follower shows (the API's /v1/status, the page): the leader's status from the cluster.
        self.cluster_status = ClusterStatus()
        self.status_view = ReplicaStatus(
            own=self.status, cluster=self.cluster_status, leading=lambda: self.leading
        )
        self.source = KubernetesSource(api, kube, writes=False)
        self.source.cache.on_read = self.cluster_status.observe
        self.credentials = CredentialsReader(api, kube.namespaces)
        self.followed = FollowedInventory.attach(
            source=self.source, credentials=self.credentials, inventory=inventory
        )
        self.credentials_writer = CredentialsWriter(api)
        self.credentials.on_deleted = self.credentials_writer.forget
        self.credentials.shared, self.credentials_writer.known = (
            self.credentials_writer.shared,
            self.credentials.held,
        )
        # the Secrets' applies in a thread of their own: 500 a stack held the loop 9-30 s (run 36)
        self.credentials_publisher = CredentialsPublisher(self.credentials_writer)
        self.credentials_publisher.leading = lambda: self.leading
        # A new leader compares each status with the watched copy, not a GET per Proxy (the intake).
        self.status_writer = StatusWriter(
            api,
            self.status,
            self.ref,
            known=self.cluster_status.raw,
            known_packed=self.cluster_status.packed,
        )
        self.cluster_status.share = self.status_writer.shared  # one copy of a status written and read back
        self.status.previous = self._previous_condition  # a new leader records no Event again for them
        self.status_writer.leading = lambda: self.leading
        self.events = EventRecorder(api, self.ref, instance=kube.identity)
        self.status.subscribe_events(self._event)
        self.elector = LeaderElector(
            api,
            kube,
            on_started=self._lead,
            on_stopped=self._follow,
            on_renewed=lambda _d: self._extend_term(),
        )
        self.controller: Controller | None = None
        self.terms = 0
        self._prober: Callable[[], Coroutine[Any, Any, None]] | None = None
        self._term_stop: asyncio.Event | None = None
        self._term: asyncio.Task[None] | None = None
        self._probing: asyncio.Task[None] | None = None
        self.pool_signals = PoolSignals(inventory)  # discovery's observer (serve attaches it)
        self.pools: ClusterPools | None = None
        # Called once a term has ended and nothing holds its controller any more (serve.py: a full
        # collection that frees what the term held in reference cycles, settled objects included).
        self.on_term_ended: Callable[[], None] = lambda: None
        self.pool_history = PoolHistory()  # the pools' last decisions, kept across terms (the fleet page)
        self._pooling: asyncio.Task[None] | None = None
        self._pools_stop = asyncio.Event()
        self._started = False
        self._budget = DeletionBudget(
            max_share=settings.deletion_budget_share, min_count=settings.deletion_budget_count
        )
        # What only the leader knows, for the followers' page (service/kube/summary.py): serve sets the
        # content (`summary_task.content`); the leader publishes it every poll it changed, a follower reads.
        self.summary = SummaryPublisher(api, kube, leading=lambda: self.leading)
        self.summary_task = SummaryTask(self.summary)
        self.summary_reader = SummaryReader(api, kube)

    # --- the face the API and the health sink use ------------------------------------------------------

    @property
    def loop_error(self) -> str | None:
        errors = self.source.watch_errors()
        if errors:
            return "watching the cluster fails: " + "; ".join(errors)
        if self.controller is not None:
            return self.controller.loop_error
        return None

    @property
    def held_deletion(self) -> HeldDeletion | None:
        return self.controller.held_deletion if self.controller is not None else None

    @property
    def budget(self) -> DeletionBudget:
        return self.controller.budget if self.controller is not None else self._budget

    def allow_deletions(self, change_id: str) -> bool:
        """Only a held change can be allowed (nothing is recorded otherwise); the allowance outlives the
        term, so a handover before it is used does not lose it."""
        return self.controller.allow_deletions(change_id) if self.controller is not None else False

    def request_repair(self, key: str) -> bool:
        return self.controller.request_repair(key) if self.controller is not None else False

    @property
    def leading(self) -> bool:
        return self.elector.is_leader

    def ref(self, key: str) -> ProxyRef | None:
        obj = self.source.object(key)
        if obj is None:
            return None
        return ProxyRef(namespace=obj.namespace, name=obj.name, uid=obj.uid, generation=obj.generation)

    def set_prober(self, prober: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """The health engine's run: started with each term, stopped with it."""
        self._prober = prober

    # --- running ----------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Watch, elect, and (as a follower) keep the inventory from the cluster, until `stop`."""
        self.source.start()
        self.credentials.start()
        self.status_writer.start()
        self.credentials_publisher.start()
        self.events.start()
        self._started = True
        synced = await asyncio.to_thread(self.source.wait_synced, SYNC_TIMEOUT)
        if not synced:
            log.error("the first list of Proxies did not finish: %s", "; ".join(self.source.watch_errors()))
        election = asyncio.create_task(self.elector.run(stop), name="leader-election")
        removals = -1
        try:
            while not stop.is_set():
                if self.source.cache.removals != removals:  # a pass over 10,000 took 50 ms of each second
                    removals = self.source.cache.removals
                    self.cluster_status.keep_only(obj.key for obj in self.source.objects())
                if not self.leading:
                    await self.follow_inventory()
                else:
                    if self.controller is not None:
                        self.summary_task.tick(term=self.terms)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.settings.poll_seconds)
        finally:
            await election  # steps down (the term closes) and releases the Lease
            await self.summary_task.close()

    async def close(self) -> None:
        await self._follow()
        if self._started:
            await asyncio.to_thread(self._stop_threads)

    def _stop_threads(self) -> None:
        self.source.stop()
        self.credentials.stop()
        self.status_writer.close()
        self.credentials_publisher.close()
        self.events.close()

    async def _lead(self) -> None:
        """A new term: finalizers and status are ours to write; a fresh controller starts in a fresh term
        (its first pass reads the backend before it decides anything destructive)."""
        self.terms += 1
        log.info("leading (term %d): reconciling and probing", self.terms)
        self.term = Term(
            f"{self.kube.identity}/{self.terms}",
            valid_until=self._term_deadline(),
            before_operation=self._before_operation,
        )
        self.source.set_writes(True)
        self.followed.mark_all()  # the term's end judges everything again: no mark kept meanwhile
        self.source.replay()  # the new term's controller learns everything from the start
        self.status_writer.begin_term()
        self._seed_health()
        self.status_view.switched()  # what this replica shows is its own board now
        self.controller = Controller(
            settings=self.settings,
            engine=self.engine,
            source=self.source,
            inventory=self.inventory,
            status=self.status,
            on_publish=self._publish_credentials,
            term=self.term,
            allowances=self.allowances,
        )
        self._term_stop = asyncio.Event()
        self._term = asyncio.create_task(self.controller.run(self._term_stop), name=f"term-{self.terms}")
        loop, controller = asyncio.get_running_loop(), self.controller
        # A change in the cluster wakes the loop at once (watch threads call this): no poll tick of latency.
        self.source.on_change = lambda: _call_soon(loop, controller.wake.set)
        if self._prober is not None:
            self._probing = asyncio.create_task(self._prober(), name="prober")
        self._start_pools()

    # --- the term's fence (automation/engine/term.py) ---------------------------------------------------

    def _term_deadline(self) -> float:
        """Until when this term's children may run: the leader's renew deadline, and never past what the
        operations heartbeat covers (so its expiry proves they are gone: service/kube/heartbeat.py)."""
        return min(self.elector.work_deadline(), max(self.heartbeat.covers_until(), 0.0))

    def _extend_term(self) -> None:
        term = self.term
        if term is not None and not term.ended:
            term.extend(self._term_deadline())

    def _before_operation(self) -> None:
        """Before an operation of this term starts (a worker thread): the heartbeat is on record, and the
        term's deadline covers it."""
        self.heartbeat.ensure()
        self._extend_term()

    def _busy(self) -> bool:
        term = self.term
        return term is not None and term.busy()

    def _seed_health(self) -> None:
        """What the previous leader's probes concluded stays until this leader's probes say otherwise: the
        inventory already holds it (as a follower), so a probe that agrees is no transition, and the status
        must not lose it."""
        for obj in self.source.objects():
            for raw in obj.status.get("conditions") or []:
                if raw.get("type") == ConditionType.HEALTHY:
                    with contextlib.suppress(ValidationError):
                        self.status.seed_condition(obj.key, Condition.model_validate(raw))
            if obj.status.get("egressIP"):
                self.status.set_egress(obj.key, str(obj.status["egressIP"]))

    def _previous_condition(self, key: str, type_: str) -> Condition | None:
        """The condition `type_` of the Proxy's status as the watch last read it (a previous leader's)."""
        for raw in self.cluster_status.raw(key).get("conditions") or []:
            if raw.get("type") == type_:
                with contextlib.suppress(ValidationError):
                    return Condition.model_validate(raw)
        return None

    async def _follow(self) -> None:
        """The term ends. First, at once: no operation starts and nothing is written any more. Then the
        loop stops and the term's children are interrupted until none is left (killed after the grace),
        beside the pools and the prober, whose stop may wait for an unreachable apiserver: it never delays
        the term's end. Last, the heartbeat says no operation of ours runs."""
        term = self.term
        ended = term is not None
        if term is not None:
            term.close()
        self.followed.mark_all()  # the inventory holds what this term published: followed from now on
        self.source.set_writes(False)
        self.source.on_change = lambda: None
        pools = asyncio.create_task(self._stop_pools(), name="pools-stop")
        if self._probing is not None:
            self._probing.cancel()
        if self._term_stop is not None and self._term is not None and self.controller is not None:
            self._term_stop.set()
            await asyncio.gather(self._term, return_exceptions=True)
            await self.controller.close(grace=min(TERM_GRACE, self.kube.renew_deadline_seconds))
            log.info("term %d ended: no operation of it runs", self.terms)
        if term is not None:
            await asyncio.to_thread(term.end, grace=TERM_GRACE)  # the controller's close did; made sure
            await asyncio.to_thread(self.heartbeat.release)
        if self._probing is not None:
            await asyncio.gather(self._probing, return_exceptions=True)
            self._probing = None
        await asyncio.gather(pools, return_exceptions=True)
        self._term = self._term_stop = None
        self.controller = None
        self.term = None
        self.followed.mark_all()  # again: the closing term's reporter may have published meanwhile
        self.status_view.switched()  # what this replica shows is the leader's, from the cluster
        if ended:
            self.on_term_ended()  # the term's state given back now, before another term builds its own

    # --- pools: the leader's, a fresh one per term (service/kube/pools.py) ---------------------------------

    def _start_pools(self) -> None:
        self.pools = ClusterPools(
            self.api, self.kube, source=self.source, signals=self.pool_signals, history=self.pool_history
        )
        self.pools.start()
        self._pools_stop = asyncio.Event()
        every = self.settings.poll_seconds
        self._pooling = asyncio.create_task(self.pools.run(self._pools_stop, every=every), name="pools")

    async def _stop_pools(self) -> None:
        """Before the term's loop stops: no child is created or deleted once the Lease may be lost."""
        if self._pooling is not None and self.pools is not None:
            self._pools_stop.set()
            await asyncio.gather(self._pooling, return_exceptions=True)
            await asyncio.to_thread(self.pools.stop)
        self._pooling = self.pools = None

    # --- what the leader publishes, what followers read ------------------------------------------------

    def _event(self, event: Event) -> None:
        if self.leading:
            self.events.record(event)

    def _publish_credentials(self, endpoint: ProxyEndpoint) -> None:
        ref = self.ref(endpoint.key)
        if ref is None or endpoint.port is None or not endpoint.host:
            return
        credentials = Credentials(
            host=endpoint.host,
            port=endpoint.port,
            protocol=endpoint.protocol,
            username=endpoint.username,
            password=endpoint.password,
            control=shared_control(endpoint.control),
        )
        self.credentials_publisher.submit(ref, credentials)  # written in its thread, never on the loop

    async def follow_inventory(self) -> None:
        """A follower serves what the leader wrote: addresses, health and the egress IP from status,
        credentials from the Secrets; only the Proxies whose object or Secret changed are judged again, in
        slices between which the event loop serves (service/kube/follower.py)."""
        while not self.leading:
            if self.followed.apply(budget=FOLLOW_SLICE):
                return
            await asyncio.sleep(0)  # the loop serves leases between two slices of a long pass
