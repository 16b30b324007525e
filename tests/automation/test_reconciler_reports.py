"""A run with no `up` reports one stack at a time, with only what a report reads of its outputs (issue 20:
four stacks' reports at once, each holding all its stack's outputs, raised a 10,000-proxy leader's RSS for
good; bench_leader_state.py measures it). The engine is the recording stand-in: no Pulumi is needed to see
how the reconciler hands its reports out."""

from __future__ import annotations

import asyncio
from typing import Any

from automation.planner import Planner, StackPlan
from automation.reconciler import REPORTED_OUTPUTS, Reconciler
from stacks.models import ProviderCatalogue, Proxy
from tests.automation.standin_engine import RecordingEngine


class _NoSecrets:
    def credentials_for(self, proxy: Proxy) -> dict[str, str] | None:
        return None

    def secret_value(self, name: str, key: str) -> str | None:
        return None


class _Reports:
    """Records each report's start and end, and lets the loop run in the middle of it (as the reporter's
    slices do)."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.outputs: list[set[str]] = []

    async def stack_applied(self, plan: StackPlan, *, outputs: dict[str, Any], **_: Any) -> None:
        self.order.append(f"{plan.name} in")
        self.outputs.append(set(outputs))
        for _slice in range(3):
            await asyncio.sleep(0)
        self.order.append(f"{plan.name} out")

    def __getattr__(self, name: str) -> Any:  # the reporter's other calls: nothing to record here
        return lambda *_a, **_k: None


def _proxy(name: str, provider: str, port: int) -> Proxy:
    return Proxy.model_validate(
        {
            "metadata": {"name": name, "namespace": "crawl"},
            "spec": {"provider": provider, "port": port, "allowedSourceRanges": ["127.0.0.0/8"]},
        }
    )


def test_runs_with_no_up_report_one_stack_at_a_time_with_what_a_report_reads() -> None:
    planner = Planner()
    planner.set_catalogue(
        ProviderCatalogue.model_validate(
            {"providers": [{"name": name, "type": "kubernetes"} for name in ("a", "b", "c")]}
        )
    )
    for n, stack in enumerate(("a", "b", "c")):
        planner.upsert(_proxy(f"p{n}", stack, 3001 + n))
    reports = _Reports()
    engine = RecordingEngine(installation="ours")
    reconciler = Reconciler(
        planner=planner,
        engine=engine,  # type: ignore[arg-type]  # the stand-in keeps the engine's contract
        reporter=reports,  # type: ignore[arg-type]
        credentials=_NoSecrets(),
        installation="ours",
    )

    async def scenario() -> None:
        for stack in ("a", "b", "c"):  # the first runs: an `up` each, reported as they end
            await reconciler(stack)
        assert engine.backend.ups == 3
        reports.order.clear()
        reports.outputs.clear()
        await asyncio.gather(*(reconciler(stack) for stack in ("a", "b", "c")))  # nothing changed

    asyncio.run(scenario())
    assert engine.backend.ups == 3, "a run with nothing changed ran an up"
    pairs = [reports.order[i : i + 2] for i in range(0, len(reports.order), 2)]
    assert sorted(pairs) == [["a in", "a out"], ["b in", "b out"], ["c in", "c out"]], reports.order
    assert reports.outputs == [set(REPORTED_OUTPUTS)] * 3
