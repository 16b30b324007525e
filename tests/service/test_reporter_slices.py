"""The reporter's pass over an applied stack (service/reporter.py `stack_applied`) lets the event loop run
between slices of its proxies: 500 proxies at once held the loop 0.5-2 s after each `up` and each resync's
check (bench_running run 37, the stall watch). Real planner, status board and inventory; the source is the
catalogue alone, as the reporter reads nothing else of it here."""

from __future__ import annotations

import asyncio

from automation.planner import Planner
from service import reporter as reporter_module
from service.inventory import Inventory
from service.reporter import Reporter
from service.status import StatusBoard
from stacks.models import ProviderCatalogue, Proxy

PROXIES = 200


class CatalogueOnly:
    def __init__(self, catalogue: ProviderCatalogue) -> None:
        self.catalogue = catalogue


def _applied() -> tuple[Reporter, object, dict[str, object]]:
    catalogue = ProviderCatalogue.model_validate({"providers": [{"name": "site", "type": "local"}]})
    planner = Planner()
    planner.set_catalogue(catalogue)
    for i in range(PROXIES):
        doc = {
            "metadata": {"name": f"p{i}", "namespace": "crawl"},
            "spec": {"provider": "site", "port": 20000 + i},
        }
        planner.upsert(Proxy.model_validate(doc))
    plan = planner.plan("site")
    planner.mark_applied(plan)
    reporter = Reporter(
        planner=planner,
        source=CatalogueOnly(catalogue),  # type: ignore[arg-type]
        inventory=Inventory(),
        status=StatusBoard(),
        leaving=lambda _key: False,
    )
    outputs = {
        "proxies": {
            p.key: {"host": "127.0.0.1", "port": p.proxy.spec.port, "protocol": "http"} for p in plan.proxies
        },
        "credentials": {},
    }
    return reporter, plan, outputs


def test_the_loop_runs_between_slices_of_an_applied_stack() -> None:
    reporter, plan, outputs = _applied()
    turns: list[int] = []

    async def scenario() -> None:
        stop = asyncio.Event()

        async def other_work() -> None:  # a lease, a probe: anything else on the loop
            while not stop.is_set():
                turns.append(len(reporter.inventory.endpoints()))
                await asyncio.sleep(0)

        other = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        await reporter.stack_applied(plan, outputs=outputs, result=None)  # type: ignore[arg-type]
        stop.set()
        await other

    asyncio.run(scenario())
    during = [n for n in turns if 0 < n < PROXIES]
    assert len(during) >= PROXIES // reporter_module.SLICE - 1, turns
    assert len(reporter.inventory.endpoints()) == PROXIES  # every proxy reported in the end
