"""What the planner keeps of each stack between plans (automation/planner.py): its planned proxies in key
order and its part of the stack hash's text, so that a plan redoes only the proxies touched since the last.
"""

from __future__ import annotations

import bisect

from stacks.models import PackedProxy, ProviderEntry, Proxy
from stacks.spec_hash import proxy_hash_fragment

__all__ = ["PlannedProxy", "StackView"]


class PlannedProxy:
    """A proxy as a stack should hold it, with its spec hash. Kept packed (see stacks/models/packed.py):
    `proxy` decodes a fresh model on each access."""

    __slots__ = ("packed", "spec_hash")

    def __init__(self, proxy: Proxy | PackedProxy, spec_hash: str) -> None:
        self.packed = proxy if isinstance(proxy, PackedProxy) else PackedProxy(proxy)
        self.spec_hash = spec_hash

    @property
    def fragment(self) -> bytes:
        """Its item of its stack's hash document, encoded (`proxy_hash_fragment`)."""
        return proxy_hash_fragment(self.packed.key, self.spec_hash).encode()

    @property
    def proxy(self) -> Proxy:
        return self.packed.proxy

    @property
    def key(self) -> str:
        return self.packed.key

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PlannedProxy):
            return NotImplemented
        return self.spec_hash == other.spec_hash and self.packed == other.packed

    def __hash__(self) -> int:
        return hash((self.packed.key, self.spec_hash))

    def __repr__(self) -> str:
        return f"PlannedProxy({self.key}, spec_hash={self.spec_hash[:12]})"


class StackView:
    """What one stack's last plan was made of, kept so that the next plan redoes only the keys touched
    since (`stale`): at 100,000 proxies, rebuilding every entry of a 500-proxy stack from the fleet-wide
    tables cost 2-2.4x what the same rebuild cost at 10,000 (the same calls over a heap ten times larger).

    The stack's part of its hash document, every live proxy's item joined by "," in key order, is kept as
    one buffer (`text`): a proxy whose spec changed has its item rewritten there in place (the same key
    gives an item of the same length), so hashing the stack again reads one block of memory instead of an
    object and a string per proxy scattered over the heap (a one-Proxy re-plan cost 1.6-1.7x at 100,000
    proxies what it cost at 10,000 when each plan joined the proxies' items). The item is found from the
    nearest of the marks kept every MARK_EVERY keys (a key and its item's offset), so only a few items are
    read before the hash reads them all. A key that comes or goes drops the buffer; the next plan builds
    it again from the live entries."""

    MARK_EVERY = 32

    __slots__ = (
        "entry",
        "entry_text",
        "in_order",
        "leaving",
        "live",
        "mark_at",
        "mark_keys",
        "stale",
        "text",
    )

    def __init__(self) -> None:
        self.stale: set[str] = set()  # keys whose entry must be worked out again
        # key -> its planned version (valid or held), in key order while `in_order`: a changed key keeps its
        # place in the dict, a new one goes last until the next plan sorts them again
        self.live: dict[str, PlannedProxy] = {}
        self.in_order = True
        self.leaving: set[str] = set()  # deleting keys placed here
        self.entry: ProviderEntry | None = None  # the entry `entry_text` was made from
        self.entry_text = ""
        self.text: bytearray | None = None  # `live`'s items of the hash document, joined; None: to build
        self.mark_keys: list[str] = []  # every MARK_EVERY-th key of `live` (in key order) ...
        self.mark_at: list[int] = []  # ... and where its item starts in `text`

    def joined(self) -> bytearray:
        """`live`'s items of the stack's hash document in key order, joined by "," (built when dropped)."""
        live = self.ordered()
        if self.text is None:
            items = [planned.fragment for planned in live.values()]
            self.text = bytearray(b",".join(items))
            self.mark_keys, self.mark_at, offset = [], [], 0
            for index, (key, item) in enumerate(zip(live, items, strict=True)):
                if index % self.MARK_EVERY == 0:
                    self.mark_keys.append(key)
                    self.mark_at.append(offset)
                offset += len(item) + 1
        return self.text

    def ordered(self) -> dict[str, PlannedProxy]:
        """`live` in key order (sorted again only after a key came)."""
        if not self.in_order:
            self.live = dict(sorted(self.live.items()))
            self.in_order = True
        return self.live

    def put(self, key: str, planned: PlannedProxy | None) -> None:
        """Set (or, with None, drop) the planned version of `key`."""
        old = self.live.get(key)
        if planned is None:
            if old is not None:
                del self.live[key]
                self.text = None
            return
        if old is None:
            self.in_order = False
            self.text = None
        elif self.text is not None and old.spec_hash != planned.spec_hash:
            self._rewrite(key, old.fragment, planned.fragment)
        self.live[key] = planned

    def _rewrite(self, key: str, old: bytes, new: bytes) -> None:
        """`key`'s item of `text` in place. An item names its key between its brackets and keys are unique,
        so the old item occurs once, between the marks around its key; one of another length (not made by
        the same key) drops the buffer."""
        text = self.text
        at = -1
        if text is not None and len(old) == len(new):
            mark = bisect.bisect_right(self.mark_keys, key) - 1
            start = self.mark_at[mark] if mark >= 0 else 0
            end = self.mark_at[mark + 1] if mark + 1 < len(self.mark_at) else len(text)
            at = text.find(old, start, end)
        if text is None or at < 0:
            self.text = None
            return
        text[at : at + len(new)] = new
