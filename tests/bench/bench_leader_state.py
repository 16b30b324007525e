"""Benchmark: what a leader keeps of each Proxy, part by part (issue 20, the Memory goal).

The leader's counterpart of bench_follower_state.py. No API server: BENCH_PROXIES (10,000) Proxy objects
(tests/kube/cluster_fleet.py's `proxy_doc`), half on a `local` provider of the catalogue (20 entries: 20
stacks) and applied there (their stacks' `up` done: outputs, addresses, Provisioned, Healthy), half on a
provider the catalogue lacks (Stalled with UnknownProvider, as bench_incluster's bulk), are fed through the
parts a leader keeps them in, in the order the leader does:
- the watched copy (`proxy_object`, service/kube/cluster_cache.py; another change shrinks it);
- the cluster status view (`ClusterStatus`, the status writer's `known`), with the status as written;
- the source's emitted copy (`KubernetesSource._emitted`: `PackedProxy`);
- the planner (`Planner.upsert`, each stack planned and marked applied);
- the status board and the reporter (`report_validity`; each stack's up: `operation_started`,
  `operation_finished`, `stack_applied`), with the inventory's endpoints it publishes;
- the health state (`Inventory.set_health`);
- the status writer's last-written copy (`StatusWriter._write`, the PATCH not sent);
- the events recorder's per-object state (`EventRecorder._send` of every event, the POST not sent).
Then a resync's reports (of the applied ones): every stack reported again from its kept outputs, as a
drift check answered from /proc does, `max_parallel` (4) stacks at a time as the queue runs them, first as the
reconciler does (one decode at a time, one report at a time, only what a report reads held through it),
then as it did before (each worker's thread decoding all its stack's outputs at once, the four reports
interleaved, each holding all its outputs): the RSS each adds and
its peak of traced memory. The RSS keeps its highest mark: the way that runs first (the current one;
BENCH_RESYNC_FIRST=before for the other) is the one whose RSS figure counts.
Each part is measured with tracemalloc (the bytes still allocated after the part took every Proxy, over
the count), and the whole with the process's VmRSS. Asserts nothing; prints bytes per Proxy.
`PYTHONPATH=$PWD .venv/bin/python tests/bench/bench_leader_state.py` (BENCH_CASE=stalled or applied: only
those; both by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import sys
import tracemalloc
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import service.kube.events as events_module  # noqa: E402
import service.kube.status_writer as writer_module  # noqa: E402
from automation.planner import Planner  # noqa: E402
from service.inventory import Health, HealthState, Inventory  # noqa: E402
from service.kube.events import EventRecorder  # noqa: E402
from service.kube.proxy_object import proxy_object  # noqa: E402
from service.kube.refs import ProxyRef  # noqa: E402
from service.kube.status_writer import StatusWriter  # noqa: E402
from service.reporter import Reporter  # noqa: E402
from service.sources.contract import SourceChange  # noqa: E402
from service.status import StatusBoard  # noqa: E402
from service.status_view import ClusterStatus  # noqa: E402
from stacks.models import PackedProxy, ProviderCatalogue, Proxy  # noqa: E402
from tests.bench.bench_follower_state import raw as follower_raw  # noqa: E402

try:
    from stacks.compact import STATUS_PACKER

    _unpack = STATUS_PACKER.unpack
except ImportError:  # a tree before stacks/compact.py: plain zlib
    _unpack = zlib.decompress

PROXIES = int(os.environ.get("BENCH_PROXIES", "10000"))
CASES = os.environ.get("BENCH_CASE", "stalled,applied").split(",")
FIRST = os.environ.get("BENCH_RESYNC_FIRST", "now")  # or "before": whose RSS the resync's figure shows
TOP = int(os.environ.get("BENCH_TOP", "0"))  # print each part's largest allocation sites
STACKS = 20


def valid(n: int) -> bool:
    return "applied" in CASES and ("stalled" not in CASES or n % 2 == 0)


def raw(n: int) -> dict[str, Any]:
    """One Proxy as the watch reads it (the follower bench's) on its provider, with no status yet and no
    managedFields (the watched copy drops them anyway: the docs stay the ones this bench always fed)."""
    doc = follower_raw(n)
    doc["spec"]["provider"] = f"local-{n % STACKS:02d}" if valid(n) else "elsewhere"
    del doc["status"], doc["metadata"]["managedFields"]
    return doc


class FakeSource:
    """What the reporter asks of the source (the catalogue; releases are not made here)."""

    def __init__(self, catalogue: ProviderCatalogue) -> None:
        self.catalogue = catalogue


def vm_rss() -> float:
    text = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("VmRSS")) / 1024


@contextmanager
def measured(what: str, figures: dict[str, float]) -> Iterator[None]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    yield
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    snapshot = tracemalloc.take_snapshot() if TOP else None
    tracemalloc.stop()
    figures[what] = (after - before) / PROXIES
    print(f"  {what:60s} {(after - before) / PROXIES:8.0f} B/Proxy  {(after - before) / 2**20:6.1f} MiB")
    if snapshot is not None:
        for stat in snapshot.statistics("lineno")[:TOP]:
            print(f"      {stat.size / PROXIES:7.0f} B/Proxy  {stat.traceback}")


def main() -> None:
    logging.disable(logging.CRITICAL)  # each Stalled Proxy logs its event
    print(f"{PROXIES} Proxies ({'+'.join(CASES)}), bytes still allocated per Proxy (tracemalloc)")
    figures: dict[str, float] = {}
    catalogue = ProviderCatalogue.model_validate(
        {"providers": [{"name": f"local-{i:02d}", "type": "local"} for i in range(STACKS)]}
    )
    start = vm_rss()
    docs = [raw(n) for n in range(PROXIES)]  # what the watch read (dropped after each part's feed)
    objects: dict[str, Any] = {}
    with measured("watched copy (ProxyObject)", figures):
        for doc in docs:
            obj = proxy_object(doc)
            objects[obj.key] = obj
    del docs, doc
    cluster = ClusterStatus()
    emitted: dict[str, PackedProxy] = {}
    with measured("source's emitted copy (PackedProxy)", figures):
        for obj in objects.values():
            packed = PackedProxy(Proxy.model_validate(obj.body))
            emitted[packed.key] = packed
    planner = Planner()
    with measured("planner (upsert, plan, mark_applied)", figures):
        dirty = planner.set_catalogue(catalogue)
        for packed in emitted.values():
            dirty |= planner.upsert(packed)
        plans = {name: planner.plan(name) for name in sorted(dirty)}
        for plan in plans.values():
            if plan.entry is not None:
                planner.mark_applied(plan)
    board, inventory = StatusBoard(), Inventory()
    reporter = Reporter(
        planner=planner,
        source=FakeSource(catalogue),  # type: ignore[arg-type]
        inventory=Inventory(),
        status=board,
        leaving=lambda _key: False,
    )

    def ref(key: str) -> ProxyRef | None:
        obj = objects.get(key)
        return None if obj is None else ProxyRef(obj.namespace, obj.name, obj.uid, obj.generation)

    # The board's events go to the recorder's bounded queue (1,000, the oldest dropped), as in the service;
    # its worker is not started: the recorder's phase sends what is queued then.
    names = iter(range(10**9))
    events_module.request_json = lambda *_a, **_k: {"metadata": {"name": f"e{next(names)}"}}  # type: ignore[assignment]
    recorder = EventRecorder(None, ref)  # type: ignore[arg-type]
    board.subscribe_events(recorder.record)
    with measured("status board + reporter (validity, up, applied)", figures):
        reporter.report_source_holds(SourceChange())
        for packed in emitted.values():
            reporter.report_validity(packed.key, deleting=False, generation=packed.generation)
        for plan in plans.values():
            if plan.entry is None:
                continue
            outputs = {
                "proxies": {
                    p.key: {
                        "host": "127.0.0.1",
                        "port": p.proxy.spec.port,
                        "protocol": "http",
                        "control": f"/tmp/state/{plan.name}/{p.key.replace('/', '-')}.sock",
                    }
                    for p in plan.proxies
                },
                "credentials": {},
            }
            reporter.operation_started(plan, type_="up")
            reporter.operation_finished(plan, type_="up")
            asyncio.run(reporter.stack_applied(plan, outputs=outputs, result=None))
            del outputs
    inventory = reporter.inventory
    with measured("health state (Inventory.set_health)", figures):
        for endpoint in inventory.endpoints():
            inventory.set_health(endpoint.key, Health(state=HealthState.healthy, egress_ip="127.0.0.1"))
            board.set_condition(endpoint.key, type_="Healthy", true=True, reason="ProbeSucceeded")

    writer_module.request_json = lambda *_a, **_k: {}  # type: ignore[assignment]  # no API server
    writer = StatusWriter(None, board, ref, known=cluster.raw)  # type: ignore[arg-type]
    if hasattr(writer, "shared"):  # joined as service/incluster.py joins them (a tree before: two copies)
        writer.known_packed = cluster.packed
        cluster.share = writer.shared
    with measured("status writer's last-written copy", figures):
        for key in board.tracked():
            writer._write(key)
    with measured("cluster status view (the status as the watch reads it back)", figures):
        for key in board.tracked():
            obj = objects[key]
            cluster.observe(
                {"metadata": {"namespace": obj.namespace, "name": obj.name}, **_status(writer, key)}
            )
    print(f"  ({len(recorder._queue)} events queued, {recorder.dropped} dropped by the recorder's queue)")
    with measured("events recorder's per-object state (the queue sent)", figures):
        while recorder._queue:
            recorder._send(recorder._queue.popleft())
    print(f"  total {sum(figures.values()):.0f} B/Proxy")
    print(f"VmRSS {vm_rss():.1f} MiB, {vm_rss() - start:.1f} MiB above the start")
    if "applied" in CASES:
        resync(planner, [plan for plan in plans.values() if plan.entry is not None], reporter)
    _ = (objects, emitted, planner, plans, board, inventory, reporter, writer, recorder, cluster)


def resync(planner: Planner, plans: list[Any], reporter: Reporter) -> None:
    """A resync's reports of every stack, 4 at a time, the current way, then the way before."""
    applied = sum(len(plan.proxies) for plan in plans)
    print(f"a resync's reports: {len(plans)} stacks of {applied} applied proxies, 4 at a time")
    from automation import local_drift
    from automation.engine import APPLIED_PROXIES_OUTPUT
    from automation.reconciler import REPORTED_OUTPUTS
    from automation.stack_outputs import StackOutputs

    store = StackOutputs()
    for plan in plans:  # what a stack of `local` proxies records (stacks/programs/local.py)
        published = {
            p.key: {
                "host": "127.0.0.1",
                "port": p.proxy.spec.port,
                "protocol": "http",
                "instanceId": f"{1000 + n}:{123456 + n}",
                "control": f"/tmp/state/{plan.name}/{p.key.replace('/', '-')}.sock",
            }
            for n, p in enumerate(plan.proxies)
        }
        applied = [p.proxy.model_dump(mode="json", by_alias=True, exclude_none=True) for p in plan.proxies]
        store.put(plan.name, {"proxies": published, "credentials": {}, APPLIED_PROXIES_OUTPUT: applied})

    def kept(outputs: dict[str, Any]) -> tuple[list[str] | None, Any]:  # the reconciler's check
        return local_drift.applied_keys(outputs), outputs.get(local_drift.PROXIES_OUTPUT)

    async def now(name: str) -> dict[str, Any]:
        await asyncio.to_thread(store.read, name, kept)  # the check (its /proc reads left out)
        return await asyncio.to_thread(store.get, name, REPORTED_OUTPUTS)  # the report's, under its lock

    async def before(name: str) -> dict[str, Any]:
        def whole() -> dict[str, Any]:
            return json.loads(zlib.decompress(store._packed[name]))  # no lock, nothing dropped

        return await asyncio.to_thread(whole)

    ways = {
        "now": ("as the reconciler reads them", now),
        "before": ("before: whole, decoded at once", before),
    }
    order = ["before", "now"] if FIRST == "before" else ["now", "before"]

    def run(read: Any) -> None:
        async def all_stacks() -> None:
            limit = asyncio.Semaphore(4)  # the queue's max_parallel
            reporting = asyncio.Lock() if read is now else contextlib.nullcontext()  # the reconciler's

            async def one(plan: Any) -> None:
                async with limit, reporting:
                    outputs = await read(plan.name)
                    await reporter.stack_applied(planner.plan(plan.name), outputs=outputs, result=None)

            await asyncio.gather(*(one(plan) for plan in plans))

        asyncio.run(all_stacks())
        gc.collect()

    for way in order:  # the RSS, untraced: the first one's figure is the one to read
        label, read = ways[way]
        gc.collect()
        rss = vm_rss()
        run(read)
        print(f"  resync's reports, {label:32s} RSS {vm_rss() - rss:+5.1f} MiB")
    for way in order:  # then each one's peak of traced memory
        label, read = ways[way]
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        run(read)
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        print(f"  resync's reports, {label:32s} peak traced {peak / 2**20:5.1f} MiB")


def _status(writer: StatusWriter, key: str) -> dict[str, Any]:
    """The status as written, as the watch reads it back (the API server's JSON: its keys sorted)."""
    written = json.loads(_unpack(writer._written[writer._uids[key]]))
    return {"status": json.loads(json.dumps(written, sort_keys=True))}


if __name__ == "__main__":
    main()
