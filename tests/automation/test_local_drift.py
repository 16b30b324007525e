"""`local_drift.unverified`: what makes a `local` stack's drift check fall back to Pulumi's refresh. The
case where every process checks out, with real proxies and the real engine: test_drift_engine.py."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from automation.local_drift import unverified
from stacks.forward_proxy.identity import start_time

APPLIED = [{"namespace": "crawl", "name": "a", "spec": {}}]


def _outputs(out: Any, applied: Any = APPLIED) -> dict[str, Any]:
    return {"appliedProxies": applied, "proxies": {"crawl/a": out} if out is not None else {}}


def test_outputs_that_record_no_process_fall_back_to_the_refresh() -> None:
    assert unverified({}) == ("-", "the stack's outputs record no proxies")
    assert unverified({"appliedProxies": APPLIED}) == ("-", "the stack's outputs record no proxies")
    assert unverified(_outputs(None)) == ("crawl/a", "the stack's outputs do not record where it serves")
    no_process = (
        {"port": 1},
        {"instanceId": "x-1", "port": 1},
        {"instanceId": "1-2"},
        {"instanceId": "1-2", "port": None},
    )
    for out in no_process:
        assert unverified(_outputs(out)) == ("crawl/a", "the stack's outputs record no process for it"), out


def test_a_process_that_is_gone_or_is_another_program_falls_back_to_the_refresh() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    gone = _outputs({"instanceId": f"{child.pid}-1", "port": 1})
    assert unverified(gone) == ("crawl/a", f"its process (pid {child.pid}) is gone")

    me = f"{os.getpid()}-{start_time(os.getpid())}"  # runs pytest, not our forward proxy
    assert unverified(_outputs({"instanceId": me, "port": 1})) == (
        "crawl/a",
        f"pid {os.getpid()} now runs another program",
    )


def test_only_applied_proxies_are_checked() -> None:
    """A proxy planned but not applied yet has no process: its `up` starts it."""
    assert unverified(_outputs(None, applied=[])) is None
