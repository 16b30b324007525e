"""What every source of desired state tells the control loop, and how deletions are declared.

A source (a folder of manifests, the Kubernetes API) answers each poll with a `SourceChange` that says two
things explicitly besides what changed:

- `complete`: this read saw the whole desired set without error. Only a complete read may declare that a
  Proxy is gone because it is absent; a read with any file-level error (a file that does not parse or cannot
  be read, a missing or broken catalogue, a Proxy whose name cannot be read) declares no deletion at all.
- `deletions`: the Proxies whose deletion this read declares, each carrying its deletion time (in a cluster:
  the deletion timestamp behind our finalizer; in a folder: removed from a complete read). Nothing else ever
  removes a running proxy.

`held` names the Proxies whose declared version could not be used this time (their file does not parse, their
document is invalid, or they are absent from an incomplete read), with why and how to fix it: they keep
their last applied version.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, overload, runtime_checkable

from stacks.models import PackedProxy, ProviderCatalogue, Proxy
from stacks.problems import Problem


@dataclass(frozen=True)
class Hold:
    """Why a Proxy's declared version is not used: a reason word (stacks.models.conditions) and a message."""

    reason: str
    message: str


class Upserts(Sequence[Proxy]):
    """Changed Proxies, kept packed (stacks/models/packed.py) until read: each read decodes a model of its
    own. A first list of 10,000 Proxies arrives in one change; holding their models together while packed
    copies are made leaves the heap fragmented for good (measured: +51 MiB against +5 MiB when each model
    is dropped at once), so the control loop takes them one at a time (`packed`)."""

    def __init__(self, proxies: Iterable[Proxy | PackedProxy] = ()) -> None:
        self._items: list[PackedProxy] = []
        self.extend(proxies)

    def append(self, proxy: Proxy | PackedProxy) -> None:
        self._items.append(proxy if isinstance(proxy, PackedProxy) else PackedProxy(proxy))

    def extend(self, proxies: Iterable[Proxy | PackedProxy]) -> None:
        for proxy in proxies.packed() if isinstance(proxies, Upserts) else proxies:
            self.append(proxy)

    def __iadd__(self, proxies: Iterable[Proxy | PackedProxy]) -> Upserts:
        self.extend(proxies)
        return self

    def packed(self) -> list[PackedProxy]:
        return list(self._items)

    def keys(self) -> list[str]:
        return [packed.key for packed in self._items]

    @overload
    def __getitem__(self, index: int) -> Proxy: ...
    @overload
    def __getitem__(self, index: slice) -> list[Proxy]: ...
    def __getitem__(self, index: int | slice) -> Proxy | list[Proxy]:
        if isinstance(index, slice):
            return [packed.proxy for packed in self._items[index]]
        return self._items[index].proxy

    def __iter__(self) -> Iterator[Proxy]:
        return (packed.proxy for packed in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Upserts):
            return self._items == other._items
        if isinstance(other, Sequence) and not isinstance(other, str):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"Upserts({self.keys()})"


@dataclass
class SourceChange:
    """What one poll found. `empty` when there is nothing to act on."""

    catalogue: ProviderCatalogue | None = None  # set when the catalogue changed
    upserts: Upserts = field(default_factory=Upserts)  # present, changed Proxies
    deletions: list[Proxy] = field(default_factory=list)  # declared deletions (deletion time set)
    complete: bool = True
    held: dict[str, Hold] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    requested: set[str] = field(default_factory=set)  # Proxies whose stack must run now (their inputs)
    reread: bool = False  # the source judged its whole input again: `held` is all it holds now

    @property
    def empty(self) -> bool:
        return (
            self.catalogue is None
            and not self.upserts
            and not self.deletions
            and not self.held
            and not self.requested
        )


@dataclass(frozen=True)
class Lane:
    """What a new term takes in ahead of the rest: `stacks` with a real change and `keys`, every Proxy those
    stacks hold or receive (see KubernetesSource.lane)."""

    stacks: frozenset[str]
    keys: frozenset[str]


@runtime_checkable
class SlicedSource(Protocol):
    """A source the control loop can judge in slices, and whose real changes it can take in first."""

    def poll_some(
        self, *, limit: int | None = None, only: Collection[str] | None = None
    ) -> tuple[SourceChange, bool]: ...

    def lane(self) -> Lane | None: ...

    def urgent(self) -> Lane | None: ...


class Source(Protocol):
    """The control loop's view of a source; the directory source and the Kubernetes source implement it."""

    problems: list[Problem]

    @property
    def catalogue(self) -> ProviderCatalogue | None: ...

    def poll(self) -> SourceChange: ...

    def track(self, proxies: Iterable[Proxy]) -> None:
        """Proxies the backend holds applied (read back at start): a complete read that lacks one declares
        its deletion; an incomplete one holds it."""

    def backend_loaded(self) -> None:
        """Every `track` of a complete read of the backend is in: destructive decisions may be taken from
        now on (until then a deletion the source cannot place is left as it is)."""

    def release(self, key: str) -> None:
        """The deleting Proxy's resources are gone (or forgotten): drop it (remove our finalizer)."""

    def proxies(self) -> list[Proxy]: ...

    def credentials_for(self, proxy: Proxy) -> dict[str, str] | None: ...

    def secret_value(self, name: str, key: str) -> str | None: ...
