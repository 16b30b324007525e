"""Each stack's last outputs, kept deflated between the runs that read them.

A stack of 500 `local` proxies has about 280 KiB of outputs (the applied proxies, each proxy's address and
its credentials), which decoded into Python dicts and strings take about 1.25 MiB: 25 MiB for the fleet at
10,000 proxies, held only to be read when the stack runs again, when a page shows it and when a new term
publishes what runs. Deflated they take about 53 KiB a stack; a read decodes them again (a few
milliseconds a stack). Secrets stay in this process's memory either way.

Decoding is one stack at a time (a lock): the queue's workers decode in threads, and four stacks' outputs
decoded at once, each held while its stack's report went on, raised a leader's RSS by 5-6 MiB for good in a
resync at 10,000 running proxies (tests/bench/bench_leader_state.py, docs/operations.md run 43). A
reader that needs only some outputs names them (`only`) and keeps only those; one that needs all of them
for a moment uses `read`, which drops them before the next decode starts.
"""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Callable, Collection
from typing import Any, TypeVar

__all__ = ["StackOutputs"]

T = TypeVar("T")
_LEVEL = 1  # the fastest: outputs are mostly unique words (ports, passwords); level 6 saves a few percent


class StackOutputs:
    """A mapping of stack name -> its last outputs (plain JSON values); each read gives a fresh copy."""

    def __init__(self) -> None:
        self._packed: dict[str, bytes] = {}
        self._names: dict[str, tuple[str, ...]] = {}  # each stack's output names, sorted (a page's row)
        self._decoding = threading.Lock()  # one stack's outputs decoded at a time

    def __contains__(self, name: object) -> bool:
        return name in self._packed

    def get(self, name: str, only: Collection[str] | None = None) -> dict[str, Any]:
        """The stack's outputs ({} when none are known); with `only`, just those of them."""
        if only is None:
            return self.read(name, lambda outputs: outputs)
        return self.read(name, lambda outputs: {key: outputs[key] for key in only if key in outputs})

    def read(self, name: str, use: Callable[[dict[str, Any]], T]) -> T:
        """`use(outputs)` of the stack's outputs decoded ({} when none are known), under the lock that keeps
        decodes one at a time: what `use` does not return is dropped before the next decode. `use` picks
        what it needs and returns (no I/O: the event loop may wait on this lock for its own read)."""
        packed = self._packed.get(name)
        with self._decoding:
            outputs: dict[str, Any] = json.loads(zlib.decompress(packed)) if packed is not None else {}
            return use(outputs)

    def names(self, name: str) -> tuple[str, ...]:
        """The stack's output names, sorted, without decoding its outputs (the leader's summary lists them
        for every stack each time it is built: decoding them all took 3% of a leader's CPU)."""
        return self._names.get(name, ())

    def put(self, name: str, outputs: dict[str, Any]) -> None:
        self._names[name] = tuple(sorted(outputs))
        text = json.dumps(outputs, separators=(",", ":"))  # ASCII: a lone surrogate read from JSON encodes
        self._packed[name] = zlib.compress(text.encode("ascii"), _LEVEL)

    def pop(self, name: str) -> None:
        self._packed.pop(name, None)
        self._names.pop(name, None)
