"""A Proxy kept as compact JSON: what the control loop holds of each of 10,000 Proxies.

A validated `Proxy` model takes about 5 KiB (seven pydantic instances, each with its dict and set of
fields); its JSON takes about 300 bytes, deflated with a dictionary of what every declaration repeats
(stacks/compact.py) about 80. The planner and the sources hold every proxy for as long as it is declared
but read most of them rarely, so they keep a `PackedProxy`: the few fields read on every plan, and
`proxy`, which validates a fresh model from the text (about 20 us) on each access. A caller may change
that model freely: the packed copy does not change.
"""

from __future__ import annotations

import sys

from stacks.compact import PROXY_PACKER
from stacks.models.proxy import Proxy

__all__ = ["PackedProxy"]


class PackedProxy:
    __slots__ = ("_packed", "deleting", "generation", "key", "provider")

    def __init__(self, proxy: Proxy) -> None:
        # exclude_unset: the text is what was declared, so the model validated back is equal to this one.
        # Deflated with a dictionary of what every declaration repeats (stacks/compact.py): a quarter.
        self._packed = PROXY_PACKER.pack(proxy.model_dump_json(by_alias=True, exclude_unset=True).encode())
        self.key = proxy.key
        self.provider = sys.intern(proxy.spec.provider)  # a few names across the fleet: one copy each
        self.deleting = proxy.metadata.deletion_timestamp is not None
        self.generation = proxy.metadata.generation  # what a status describing this version observes

    @property
    def proxy(self) -> Proxy:
        return Proxy.model_validate_json(PROXY_PACKER.unpack(self._packed))

    @property
    def flat_name(self) -> str:
        """`<namespace>-<name>`, the name providers with flat names derive physical names from."""
        return self.key.replace("/", "-", 1)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PackedProxy):
            return NotImplemented
        return self._packed == other._packed or self.proxy == other.proxy

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"PackedProxy({self.key}, provider={self.provider}, deleting={self.deleting})"
