"""`proxy-operator serve`: the control loop, the health engine and the API in one process.

Assembly only: every part is built from the settings and handed its collaborators explicitly. uvicorn owns
the signals: the first Ctrl-C or SIGTERM ends the API, then the prober stops and the controller closes
(running `pulumi` children get SIGINT and cancel cleanly, leaving no lock).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry

from automation.inspect import StackInspector
from service import api_server, gc_tuning, ui
from service.api import create_app
from service.auth import TokenAuthenticator, TokenEntry, hash_token
from service.config import OperatorSettings, secret_file
from service.controller import Controller
from service.discovery.memory import MemoryStore
from service.discovery.service import DiscoveryService
from service.discovery.store import Store
from service.health.engine import HealthEngine, HealthTransition
from service.health.metrics import HealthMetrics
from service.health.probe import ProxyProber
from service.health.readiness import leases_not_ready
from service.health.thresholds import Thresholds
from service.incluster import ClusterMode
from service.inventory import Inventory
from service.kube.client import api_client
from service.kube.settings import KubeSettings
from service.logging_setup import access_log
from service.loop_lag import LoopLag
from service.loop_stalls import StallWatch
from service.memory import trim_periodically
from service.pools.wiring import attach_discovery
from service.runner import build_controller
from service.supervise import Supervised
from service.ui.sources import (
    desired_hashes,
    forgotten,
    held_deletion,
    pool_decisions,
    pool_statuses,
    provenance,
    stack_rows,
    summary_content,
)

log = logging.getLogger(__name__)

ALL_SCOPES = ["lease", "report", "admin", "view"]


@dataclass
class Service:
    controller: Controller | ClusterMode  # folder mode: the control loop; in a cluster: the elected one
    health: HealthEngine
    discovery: DiscoveryService
    server: uvicorn.Server
    listener: socket.socket  # bound by build_service; uvicorn serves on it and closes it
    prober: Supervised  # the health engine's run, restarted if it ever fails
    lag: LoopLag | None = None  # the event loop's lag on /metrics (service/loop_lag.py)
    stalls: StallWatch | None = None  # where the loop was when it ran late (service/loop_stalls.py)
    trim_seconds: float = 0.0  # free C heap pages given back this often (service/memory.py); 0: never
    gc_seconds: float = 0.0  # settled objects frozen out of the collector this often (gc_tuning.py); 0: never
    gc_metrics: gc_tuning.SettleMetrics | None = None  # each settle's pause on /metrics

    @property
    def port(self) -> int:
        """The port actually bound (the setting may be 0: any free port)."""
        return int(self.listener.getsockname()[1])


def build_service(
    settings: OperatorSettings,
    manifests: Path | None,
    *,
    port: int | None = None,
    kube: KubeSettings | None = None,
) -> Service:
    """Every part, wired; the API's socket is bound here, so the probe URL names the port actually bound.
    `manifests`: the folder mode; None: the in-cluster mode, configured by `kube`."""
    listener = bind_listener(settings.listen_host, settings.listen_port if port is None else port)
    try:
        return _assemble(settings, manifests, listener, kube=kube)
    except BaseException:
        listener.close()
        raise


BACKLOG = 2048  # uvicorn's default


class ListenError(Exception):
    """The API's address cannot be bound (in use, not an address of this machine, no permission)."""


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: the kernel picks a free one)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # Listening now, not when uvicorn starts: `serve` prints its address before that, and a client
        # that connected at once was refused (a bench run lost its folder-mode service to it).
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


def _assemble(
    settings: OperatorSettings, manifests: Path | None, listener: socket.socket, *, kube: KubeSettings | None
) -> Service:
    inventory = Inventory()
    # The programs allow the probe's echo endpoint in every proxy's egress policy: they get the URL in use.
    probe_url = (
        settings.health.probe_url or f"http://{_probe_host(settings)}:{listener.getsockname()[1]}/v1/echo"
    )
    settings = settings.model_copy(
        update={"health": settings.health.model_copy(update={"probe_url": probe_url})}
    )
    controller: Controller | ClusterMode
    if manifests is not None:
        controller = build_controller(settings, manifests, inventory=inventory)
    else:
        kube = kube or KubeSettings()
        controller = ClusterMode(
            settings=settings,
            kube=kube,
            api=api_client(kube.kubeconfig, kube.service_account_dir),
            inventory=inventory,
        )
    registry = CollectorRegistry()
    probes = ui.ProbeHistory()  # the fleet page's chart of each proxy's last probes
    listen_port = listener.getsockname()[1]
    health = HealthEngine(
        inventory=inventory,
        prober=ProxyProber(
            probe_url=settings.health.probe_url or f"http://{_probe_host(settings)}:{listen_port}/v1/echo",
            connect_timeout=settings.health.connect_timeout_seconds,
            timeout=settings.health.probe_timeout_seconds,
        ),
        metrics=HealthMetrics(registry, health=inventory.health_snapshot),
        thresholds=Thresholds(
            unhealthy=settings.health.unhealthy_threshold, healthy=settings.health.healthy_threshold
        ),
        interval=settings.health.interval_seconds,
        jitter=settings.health.jitter,
        concurrency=settings.health.concurrency,
        on_transition=_health_to_status(controller),
        on_probe=probes.record,
        on_gone=probes.forget,
    )
    store = _store(settings)
    discovery = DiscoveryService(
        inventory=inventory,
        store=store,
        settings=settings.discovery,
        on_error_report=lambda key: _spawn(health.record_failure(key)),
        no_candidate_retry=settings.health.interval_seconds,
    )
    attach_discovery(controller.source, discovery)  # pools count hand-outs, 503s and ban reports
    prober = Supervised("prober", health.run)
    if isinstance(controller, ClusterMode):
        controller.set_prober(prober.run)  # only the leader probes
        discovery.observer = controller.pool_signals  # its pools' signals (children are Proxy objects)
    app = create_app(
        inventory=inventory,
        discovery=discovery,
        authenticator=_authenticator(settings),
        registry=registry,
        stack_inspector=StackInspector(controller.engine),
        status_board=controller.status_view if isinstance(controller, ClusterMode) else controller.status,
        ready_checks=(_loop_check(controller), prober.ready, _leases_check(inventory)),
        deletions=controller,
        body_exempt={ui.LOGIN_PATH: ui.LOGIN_BODY_LIMIT} if settings.ui.enabled else None,
    )
    if settings.ui.enabled:
        page = ui.build(
            app.state.context,
            settings=settings.ui,
            key=settings.ui_session_key(),
            stacks=stack_rows(controller, owner=settings.installation_name()),
            probes=probes,
            ended=_ended_sessions(store),
        )
        page.pools = pool_statuses(controller)
        page.held = held_deletion(controller)
        page.decisions = pool_decisions(controller)
        page.forgotten = forgotten(controller)
        page.desired = desired_hashes(controller)
        if isinstance(controller, ClusterMode):
            page.leader = _leader_name(controller)
            page.provenance = provenance(controller)
        ui.install(app, page)
    if isinstance(controller, ClusterMode):  # the followers' page shows what only the leader knows
        controller.summary_task.content = summary_content(controller, owner=settings.installation_name())
    config = api_server.server_config(
        app,
        host=settings.listen_host,
        port=listen_port,
        log_config=None,
        access_log=access_log(settings.access_log),
        lifespan="on",
        proxy_headers=False,  # /v1/echo must report the peer (the egress IP), never a forwarded header
    )
    lag = LoopLag(registry)
    return Service(
        controller=controller,
        health=health,
        discovery=discovery,
        server=ApiServer(config),
        listener=listener,
        prober=prober,
        lag=lag,
        stalls=_stall_watch(registry, lag, settings.loop_stall_seconds),
        trim_seconds=settings.malloc_trim_seconds,
        gc_seconds=settings.gc_settle_seconds,
        gc_metrics=gc_tuning.SettleMetrics(registry),
    )


def _stall_watch(registry: CollectorRegistry, lag: LoopLag, threshold: float) -> StallWatch | None:
    if threshold <= 0:
        return None
    return StallWatch(registry, threshold=threshold, period=lag.every, beat=lambda: lag.last_wake)


class ApiServer(uvicorn.Server):
    """uvicorn's server, except that a signal it caught is not raised again once it stopped: uvicorn
    re-raises SIGTERM/SIGINT after its shutdown (so the process would die right there), but `serve` still
    has to stop the control loop (release the Lease, SIGINT running `pulumi` children so they unlock)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            yield
            if self._captured_signals:
                log.info(
                    "stopping on signal %s", ", ".join(signal.Signals(s).name for s in self._captured_signals)
                )
            self._captured_signals.clear()


def run(service: Service) -> None:
    """`serve` on the event loop the API's server is configured with (service/api_server.py)."""
    api_server.run(serve(service), service.server.config)


async def serve(service: Service) -> None:
    stop = asyncio.Event()
    control = asyncio.create_task(service.controller.run(stop), name="controller")
    prober = asyncio.create_task(
        service.prober.run() if isinstance(service.controller, Controller) else stop.wait(), name="prober"
    )
    lag = asyncio.create_task(service.lag.run() if service.lag else stop.wait(), name="loop-lag")
    if service.stalls is not None:
        service.stalls.start()
    trim = asyncio.create_task(trim_periodically(service.trim_seconds), name="malloc-trim")
    on_settle = service.gc_metrics.observe if service.gc_metrics else None
    gc_tuning.tune(service.gc_seconds, on_settle)
    if isinstance(service.controller, ClusterMode):
        service.controller.on_term_ended = lambda: _release_term(service.gc_seconds > 0, on_settle)
    settle = asyncio.create_task(
        gc_tuning.settle_periodically(service.gc_seconds, on_settle=on_settle), name="gc-settle"
    )
    try:
        log.info("API served by uvicorn on %s", api_server.describe(service.server.config))
        await service.server.serve(sockets=[service.listener])
    finally:
        service.listener.close()  # uvicorn closes it on a clean shutdown; not when its startup failed
        stop.set()
        prober.cancel()
        lag.cancel()
        trim.cancel()
        settle.cancel()
        await asyncio.gather(prober, lag, trim, settle, return_exceptions=True)
        if service.stalls is not None:
            service.stalls.stop()
        await control
        await service.controller.close()
        log.info("stopped cleanly")


def _release_term(tuned: bool, on_settle: gc_tuning.OnSettle | None) -> None:
    """A leadership term ended: what it held goes now, not at the next settle (gc_tuning.release)."""
    frozen, took = gc_tuning.release(tuned=tuned)
    log.info("the ended term's state released: a full collection in %.0f ms", took * 1000)
    if tuned and on_settle is not None:
        on_settle(frozen, took)


# --- parts -------------------------------------------------------------------------------------------


def _store(settings: OperatorSettings) -> Store:
    if settings.discovery.store == "redis":
        from service.discovery.redis_store import RedisStore

        return RedisStore.from_url(settings.discovery.redis_url or "", prefix=settings.discovery.redis_prefix)
    discovery = settings.discovery
    return MemoryStore(ended_kept=discovery.ended_leases_kept, report_keep=discovery.report_keep_seconds)


def _ended_sessions(store: Store) -> ui.EndedSessions | None:
    """Log outs in Redis when the discovery store is Redis (every replica refuses an ended session).

    The Redis client (redis-py, and with it OpenTelemetry: about 7 MiB of RSS) is imported only when the
    store is Redis's: a replica on the memory store never loads it (tests/service/test_lazy_imports.py)."""
    if not isinstance(store, MemoryStore):  # the check that needs no import: Redis's is the only other
        from service.discovery.redis_store import RedisStore

        if isinstance(store, RedisStore):
            return ui.RedisEndedSessions(store.client, prefix=store.prefix)
    return None


def _authenticator(settings: OperatorSettings) -> TokenAuthenticator:
    if settings.discovery.tokens_file is not None:
        return TokenAuthenticator(path=settings.discovery.tokens_file)
    token = dev_token(settings.state_dir)
    log.warning(
        "no tokens file configured (PROXY_OPERATOR_DISCOVERY_TOKENS_FILE): a development token with all "
        "scopes is in %s",
        settings.state_dir / "dev-token",
    )
    entry = TokenEntry(name="local-dev", scopes=frozenset(ALL_SCOPES), sha256=hash_token(token))
    return TokenAuthenticator([entry])


def token_hint(settings: OperatorSettings) -> str:
    if settings.discovery.tokens_file is not None:
        return f"from {settings.discovery.tokens_file}"
    return f"cat {settings.state_dir / 'dev-token'}"


def dev_token(state_dir: Path) -> str:
    """The embedded default's token, kept in state_dir/dev-token."""
    return secret_file(state_dir / "dev-token")


def _probe_host(settings: OperatorSettings) -> str:
    return "127.0.0.1" if settings.listen_host in ("0.0.0.0", "::", "") else settings.listen_host


def _leader_name(cluster: ClusterMode) -> Callable[[], str | None]:
    return lambda: None if cluster.leading else (cluster.elector.holder() or "nobody yet")


def _loop_check(controller: Controller | ClusterMode) -> Callable[[], Awaitable[str | None]]:
    async def check() -> str | None:
        return controller.loop_error

    return check


def _leases_check(inventory: Inventory) -> Callable[[], Awaitable[str | None]]:
    async def check() -> str | None:
        return leases_not_ready(inventory)

    return check


def _health_to_status(controller: Controller | ClusterMode) -> Callable[[HealthTransition], None]:
    def sink(transition: HealthTransition) -> None:
        healthy = transition.current == "healthy"
        if not healthy:
            controller.request_repair(transition.key)  # its resources may be gone: check its stack soon
        controller.status.set_condition(
            transition.key,
            type_="Healthy",
            true=healthy,
            reason="ProbeSucceeded" if healthy else "ProbeFailed",
            message=transition.reason,
            warning=not healthy,
        )
        controller.status.set_egress(transition.key, transition.egress_ip)

    return sink


_background: set[asyncio.Task[None]] = set()


def _spawn(coro: Coroutine[Any, Any, None]) -> None:
    """Fire and forget, keeping a reference so the task is not garbage-collected mid-flight."""
    task = asyncio.ensure_future(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)
