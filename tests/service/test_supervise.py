"""The prober's supervisor: a crash is logged, shown to /readyz, and the role starts again."""

from __future__ import annotations

import asyncio

import pytest

from service.supervise import Supervised


def test_a_crashing_role_is_reported_and_restarted(caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []
    crashed, resumed = asyncio.Event(), asyncio.Event()

    async def role() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            crashed.set()
            raise RuntimeError("probe loop broke")
        resumed.set()
        await asyncio.sleep(3600)

    async def scenario() -> None:
        supervised = Supervised("prober", role, pause=0.05)
        task = asyncio.create_task(supervised.run())
        await asyncio.wait_for(crashed.wait(), 5)
        await asyncio.sleep(0)
        assert await supervised.ready() == "the prober failed: RuntimeError: probe loop broke"
        await asyncio.wait_for(resumed.wait(), 5)
        assert await supervised.ready() is None
        assert supervised.restarts == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert any("probe loop broke" in r.getMessage() and r.exc_info for r in caplog.records)
