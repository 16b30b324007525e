"""Each stack's last outputs, kept deflated between the runs that read them.

A stack of 500 `local` proxies has about 280 KiB of outputs (the applied proxies, each proxy's address and
its credentials), which decoded into Python dicts and strings take about 1.25 MiB: 25 MiB for the fleet at
10,000 proxies, held only to be read when the stack runs again, when a page shows it and when a new term
publishes what runs. Deflated they take about 53 KiB a stack; a read decodes them again (a few
milliseconds a stack). Secrets stay in this process's memory either way.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

__all__ = ["StackOutputs"]

_LEVEL = 1  # the fastest: outputs are mostly unique words (ports, passwords); level 6 saves a few percent


class StackOutputs:
    """A mapping of stack name -> its last outputs (plain JSON values); each read gives a fresh copy."""

    def __init__(self) -> None:
        self._packed: dict[str, bytes] = {}
        self._names: dict[str, tuple[str, ...]] = {}  # each stack's output names, sorted (a page's row)

    def __contains__(self, name: object) -> bool:
        return name in self._packed

    def get(self, name: str) -> dict[str, Any]:
        """The stack's outputs, or {} when none are known."""
        packed = self._packed.get(name)
        if packed is None:
            return {}
        outputs: dict[str, Any] = json.loads(zlib.decompress(packed))
        return outputs

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
