"""service/gc_tuning.py, for real, each case in a Python process of its own (freezing is process-wide)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from service.config import OperatorSettings

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """
import asyncio, gc, sys, weakref
sys.path.insert(0, sys.argv[1])
from service import gc_tuning

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.b, b.a = b, a
    return a
"""


def _run(body: str) -> list[str]:
    script = PRELUDE + textwrap.dedent(body)
    env = {k: v for k, v in os.environ.items() if k != "PROXY_OPERATOR_GC_SETTLE_SECONDS"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(ROOT)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_settled_objects_are_frozen_and_a_later_settle_collects_their_cycles() -> None:
    said = _run(
        """
        old = cycle()
        ref = weakref.ref(old)
        assert gc_tuning.tune(300)
        print(gc.get_threshold()[0] == gc_tuning.YOUNG, gc.get_freeze_count() > 1000)
        del old
        gc.collect()
        print(ref() is not None)  # frozen: no collection sees it
        young = cycle()
        young_ref = weakref.ref(young)
        del young
        gc.collect()
        print(young_ref() is None)  # made after the settle: collected as usual
        frozen, took = gc_tuning.settle()
        print(ref() is None)  # the next settle gives it back to the collector first
        """
    )
    assert said == ["True", "True", "True", "True", "True"]


def test_release_collects_frozen_cycles_and_freezes_again_only_when_tuned() -> None:
    """A term's end (service/incluster.py, on_term_ended): what the last settle froze is collected now."""
    said = _run(
        """
        for tuned in (True, False):
            old = cycle()
            ref = weakref.ref(old)
            gc.freeze()  # as a settle leaves it
            del old
            gc.collect()
            alive = ref() is not None
            frozen, took = gc_tuning.release(tuned=tuned)
            print(alive, ref() is None, (frozen > 0) == tuned, gc.get_freeze_count() == frozen)
            gc.unfreeze()
        """
    )
    assert said == ["True"] * 8


def test_zero_leaves_the_collector_as_it_comes() -> None:
    said = _run(
        """
        before = gc.get_threshold()
        print(gc_tuning.tune(0), gc.get_threshold() == before, gc.get_freeze_count())
        asyncio.run(gc_tuning.settle_periodically(0))  # returns at once
        """
    )
    assert said == ["False", "True", "0"]


def test_settles_run_periodically_until_cancelled() -> None:
    said = _run(
        """
        async def main():
            task = asyncio.create_task(gc_tuning.settle_periodically(0.05, first=0.01))
            old = cycle()
            ref = weakref.ref(old)
            await asyncio.sleep(0.03)  # the first settle froze it
            del old
            gc.collect()
            print(ref() is not None)
            await asyncio.sleep(0.1)  # the next ones collected it
            print(ref() is None)
            task.cancel()
        asyncio.run(main())
        """
    )
    assert said == ["True", "True"]


def test_the_setting_is_five_minutes_and_off_in_the_tests_own_process() -> None:
    assert OperatorSettings().gc_settle_seconds == 0  # tests/conftest.py: off in the tests' own process
    assert OperatorSettings(gc_settle_seconds=120).gc_settle_seconds == 120
    assert OperatorSettings.model_fields["gc_settle_seconds"].default == 300
