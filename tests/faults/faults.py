"""The faults the campaign injects, each a function of the campaign's `Context` and its random source.

Each returns a short description of what it did (printed and counted by kind).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from tests.faults.record import Record
from tests.faults.relay import Relay
from tests.faults.replicas import LEASE_SECONDS, ReplicaSet
from tests.faults.world import BASE, PROVIDERS, MassDeletion, Tracked, World


@dataclass
class Context:
    world: World
    replicas: ReplicaSet
    record: Record
    relay: Relay
    restart_apiserver: Callable[[], None]
    rng: random.Random


def _wait_up(ctx: Context, identity: str, within: float = 40.0) -> bool:
    """Until the record shows an `up` of `identity` running."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if ctx.record.running("up", replica=identity):
            return True
        time.sleep(0.05)
    return False


def _provoke_up(ctx: Context) -> None:
    """A new Proxy: the leader runs an `up` of its stack."""
    ctx.world.create(ctx.rng.choice(PROVIDERS))


def kill_leader_during_up(ctx: Context) -> str:
    leader = ctx.replicas.wait_leader()
    if leader is None:
        return "no leader to kill"
    _provoke_up(ctx)
    caught = _wait_up(ctx, leader.identity)
    if caught:
        time.sleep(ctx.rng.uniform(0.1, 2.0))
    running = [c.stack for c in ctx.record.running("up", replica=leader.identity)]
    dead = ctx.replicas.kill(leader)
    replacement = ctx.replicas.start()
    return (f"SIGKILL {leader.identity} (up running on {running or 'nothing any more'}; "
            f"all its processes dead: {dead}, Pod deleted); started {replacement.identity}")  # fmt: skip


def sigstop_leader(ctx: Context) -> str:
    leader = ctx.replicas.wait_leader()
    if leader is None:
        return "no leader to stop"
    _provoke_up(ctx)
    caught = _wait_up(ctx, leader.identity, within=20)
    pids = [leader.process.pid, *leader.processes()]
    for pid in dict.fromkeys(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    pause = LEASE_SECONDS + ctx.rng.uniform(2.0, 10.0)
    time.sleep(pause)
    for pid in dict.fromkeys([*pids, *leader.processes()]):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    return (
        f"SIGSTOP {leader.identity} ({len(pids)} processes, up running: {caught}) for {pause:.1f} s, SIGCONT"
    )


def mass_deletion(ctx: Context) -> str:
    live = [t for t in ctx.world.live() if t.pid is not None and not t.skip_cleanup]
    count = max(1, round(len(live) * 0.6))
    chosen = ctx.rng.sample(live, min(count, len(live)))
    mass = MassDeletion(
        number=len(ctx.world.masses),
        names=[t.name for t in chosen],
        started=time.time(),
        # As the service counts its fleet: every proxy a stack holds or a planned `up` adds, deleting or not.
        fleet=sum(1 for t in ctx.world.proxies.values() if t.port is not None and t.gone is None),
    )
    ctx.world.masses.append(mass)
    spread = ctx.rng.uniform(1.0, 4.0)
    for tracked in chosen:
        tracked.mass = mass.number
        ctx.world.delete(tracked)
        time.sleep(spread / max(1, len(chosen)))
    return f"mass deletion #{mass.number}: {len(chosen)} of {len(live)} over {spread:.1f} s"


def skip_cleanup_during_deletion(ctx: Context) -> str:
    live = [t for t in ctx.world.live() if t.pid is not None and not t.skip_cleanup]
    if not live:
        return "no Ready proxy to delete"
    tracked = ctx.rng.choice(live)
    ctx.world.delete(tracked)
    time.sleep(ctx.rng.uniform(0.0, 0.3))
    ctx.world.annotate_skip(tracked)
    alive = tracked.alive_when_annotated
    return f"deleted {tracked.name}, then annotated skip-cleanup (its process alive then: {alive})"


def rolling_restart(ctx: Context) -> str:
    live = [t for t in ctx.world.live() if t.pid is not None]
    pending = ctx.rng.choice(live) if live else None
    if pending is not None:
        ctx.world.delete(pending)
    done = []
    for replica in list(ctx.replicas.live()):
        leftovers_before_kill: list[int] = []
        code = ctx.replicas.terminate(replica, check=leftovers_before_kill)
        if code != 0:
            ctx.world.violate(
                "unclean-exit", f"{replica.identity} after SIGTERM: exit {code}\n{replica.tail(12)}"
            )
        for pid in leftovers_before_kill:
            ctx.world.violate("stray-pulumi", f"pid {pid} of {replica.identity} outlived its clean exit")
        new = ctx.replicas.start()
        done.append(f"{replica.identity}->{new.identity} ({code})")
        ctx.replicas.wait_leader(within=30)
    return f"rolling restart with {pending.name if pending else 'no'} deletion pending: {', '.join(done)}"


def restart_apiserver(ctx: Context) -> str:
    started = time.monotonic()
    ctx.restart_apiserver()
    return f"kube-apiserver restarted ({time.monotonic() - started:.1f} s)"


def drop_watches(ctx: Context) -> str:
    return f"relay cut: {ctx.relay.cut()} sockets closed"


def catalogue_typo(ctx: Context) -> str:
    wrong = ctx.rng.choice(PROVIDERS)
    names = [f"{n}x" if n == wrong else n for n in PROVIDERS]
    ctx.world.set_catalogue(names)
    hold = ctx.rng.uniform(4.0, 10.0)
    time.sleep(hold)
    ctx.world.set_catalogue(list(PROVIDERS))
    return f"catalogue entry {wrong} renamed {wrong}x for {hold:.1f} s, then fixed"


def pool_typo(ctx: Context) -> str:
    world = ctx.world
    name = f"pool{len(world.proxies):03d}"
    pool = {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {"name": name, "namespace": world.namespace},
        "spec": {"replicas": 1, "placement": [{"provider": "no-such-provider", "portBase": 19500}],
                 "template": {"spec": {"allowedSourceRanges": ["127.0.0.0/8"]}}},
    }  # fmt: skip
    pools = f"{BASE}/namespaces/{world.namespace}/proxypools"
    world.call("POST", pools, pool)
    hold = ctx.rng.uniform(4.0, 8.0)
    time.sleep(hold)
    world.call("DELETE", f"{pools}/{name}")
    children = world.call("GET", f"{BASE}/namespaces/{world.namespace}/proxies",
                          None) or {"items": []}  # fmt: skip
    deleted = []
    for child in children["items"]:
        if (child["metadata"].get("labels") or {}).get("crawl.example.com/pool") == name:
            tracked = Tracked(name=child["metadata"]["name"], provider="no-such-provider", port=None)
            world.proxies[tracked.name] = tracked
            world.delete(tracked)  # no garbage collector runs here: the campaign deletes the children
            deleted.append(tracked.name)
    return f"pool {name} placed on an unknown provider for {hold:.1f} s; deleted with its children {deleted}"


FAULTS: dict[str, Callable[[Context], str]] = {
    "kill-leader-during-up": kill_leader_during_up,
    "sigstop-leader": sigstop_leader,
    "mass-deletion": mass_deletion,
    "skip-cleanup-during-deletion": skip_cleanup_during_deletion,
    "rolling-restart": rolling_restart,
    "apiserver-restart": restart_apiserver,
    "watch-drop": drop_watches,
    "catalogue-typo": catalogue_typo,
    "pool-typo": pool_typo,
}
