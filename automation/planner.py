"""Desired proxies + catalogue -> one stack plan per provider instance, incrementally.

The planner keeps every proxy's hash and the set of proxies per stack, so that a change to one proxy costs
work proportional to its stack, not to the fleet: `upsert`/`remove` say which stacks got dirty and `plan`
recomputes only the stack asked for, and within it only the proxies that changed since its last plan (each
stack keeps its planned entries and its part of the stack hash's text, where a changed proxy's item is
rewritten in place). A proxy that fails validation is left
out with its reason; if an earlier version of it was valid or applied, that last good version stays -- in
the stack where it runs, even when the new version names another (unknown) provider -- and the rejection is
still reported. Proxies are removed only through a deleting record (a declared deletion); `release` never
drops a proxy that was declared again while its deletion ran.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from weakref import WeakValueDictionary

from automation.errors import InvalidInputError, PermanentError, UnknownProviderError
from automation.flat_names import FlatNameGroups
from automation.stack_view import PlannedProxy, StackView
from stacks.keyset import KeySet
from stacks.models import PackedProxy, ProviderCatalogue, ProviderEntry, Proxy
from stacks.models.conditions import Reason
from stacks.spec_hash import entry_hash_text, proxy_spec_hash, stack_spec_hash_joined
from stacks.validation import FieldProblem, proxy_problems

__all__ = ["PlannedProxy", "Planner", "StackPlan", "flat_name", "is_deleting", "wants_skip_cleanup"]

SKIP_CLEANUP = "crawl.example.com/skip-cleanup"


def wants_skip_cleanup(proxy: Proxy) -> bool:
    return proxy.metadata.annotations.get(SKIP_CLEANUP, "").strip().lower() == "true"


def is_deleting(proxy: Proxy) -> bool:
    return proxy.metadata.deletion_timestamp is not None


@dataclass(frozen=True)
class StackPlan:
    """What one stack should hold. `entry` is None when the catalogue lacks the provider."""

    name: str
    entry: ProviderEntry | None
    proxies: tuple[PlannedProxy, ...]
    deleting: tuple[Proxy, ...] = ()  # leave the stack; released after the next successful up
    forget: tuple[Proxy, ...] = ()  # deleting with skip-cleanup: drop from state, keep the resources
    spec_hash: str = ""

    @property
    def referenced(self) -> bool:
        """Does any proxy, live or leaving, still name this provider?"""
        return bool(self.proxies or self.deleting or self.forget)


class _Held:
    """What the planner holds of one key: its declared (or deleting) version with its spec hash, its last
    good version, and the stack it is placed in. One record and one dict entry a key instead of a table
    each: at 100,000 proxies each lookup in a fleet-wide table is a cache miss (about 0.3 us more than at
    10,000 here), and a change made a dozen of them."""

    __slots__ = ("good", "home", "packed", "spec_hash")

    def __init__(self, packed: PackedProxy, spec_hash: str) -> None:
        self.packed = packed
        self.spec_hash = spec_hash
        self.good: PlannedProxy | None = None  # the last version that passed validation (or was applied)
        self.home: str | None = None  # the stack it is placed in


@dataclass
class Planner:
    catalogue: ProviderCatalogue = field(default_factory=ProviderCatalogue)
    _held: dict[str, _Held] = field(default_factory=dict)
    # keys some stack holds (outputs, or a planned up); sets as dicts' keys (stacks/keyset.py: 21 B a key)
    _applied: KeySet = field(default_factory=KeySet)
    _by_stack: dict[str, KeySet] = field(default_factory=lambda: defaultdict(KeySet))
    _by_flat_name: FlatNameGroups = field(default_factory=FlatNameGroups)
    rejected: dict[str, PermanentError] = field(default_factory=dict)
    _views: dict[str, StackView] = field(default_factory=dict)
    # (kind, message, reason) -> the error `rejected` holds for each Proxy refused so (while one is)
    _errors: WeakValueDictionary[tuple[type[PermanentError], str, str | None], PermanentError] = field(
        default_factory=WeakValueDictionary
    )

    # --- changes ----------------------------------------------------------------------------------------

    def set_catalogue(self, catalogue: ProviderCatalogue) -> set[str]:
        """Replace the catalogue; returns the stacks whose entry changed (their hash includes it)."""
        old = {entry.name: entry for entry in self.catalogue.providers}
        new = {entry.name: entry for entry in catalogue.providers}
        self.catalogue = catalogue
        dirty = {name for name in old.keys() | new.keys() if old.get(name) != new.get(name)}
        for held in [held for held in self._held.values() if held.packed.provider in dirty]:
            dirty |= self._settle(held)
        return dirty

    def upsert(self, given: Proxy | PackedProxy) -> set[str]:
        """Add or change a proxy (a deleting one too); returns the stacks to re-plan (old and new). A packed
        proxy is kept as given (a source's copy is shared, not made again)."""
        packed = given if isinstance(given, PackedProxy) else PackedProxy(given)
        proxy = given.proxy if isinstance(given, PackedProxy) else given
        return self._declare(packed, proxy, proxy_spec_hash(proxy))

    def _declare(self, packed: PackedProxy, proxy: Proxy, spec_hash: str, good: bool = False) -> set[str]:
        """`upsert` of a packed proxy with its model and hash; `good`: it is also its last good version
        (an applied version read back)."""
        key = packed.key  # the packed copy's: one string per key, shared with the source
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = _Held(packed, spec_hash)
        else:
            held.packed, held.spec_hash = packed, spec_hash
        if good and held.good is None:
            held.good = PlannedProxy(proxy=packed, spec_hash=spec_hash)
        dirty = self._settle(held, proxy)
        flat = flat_name(proxy)
        self._by_flat_name.add(flat, key)
        return dirty | self._revalidate_group(flat, key)

    def release(self, proxy: Proxy) -> bool:
        """Forget a deleting proxy whose resources are gone; True when released. A proxy declared again
        meanwhile (a restore) stays, no longer applied: its stack's next run creates it again."""
        held = self._held.get(proxy.key)
        if held is not None and not held.packed.deleting:
            self._applied.discard(proxy.key)
            return False
        self.remove(proxy.key)
        return True

    def remove(self, key: str) -> set[str]:
        """Forget a proxy entirely."""
        held = self._held.pop(key, None)
        self._applied.discard(key)
        self.rejected.pop(key, None)
        if held is None:
            return set()
        stack = held.home
        if stack is not None:
            self._by_stack[stack].discard(key)
            self._touch(key, stack)
        return ({stack} if stack else set()) | self._regroup(held.packed.flat_name, key)

    def remember_applied(self, proxies: list[Proxy]) -> set[str]:
        """What a stack last applied (read back at start): each becomes the proxy's last good version, and
        a proxy the source has not declared (yet) is held at it. Returns the stacks to re-plan."""
        dirty: set[str] = set()
        for proxy in proxies:
            self._applied.add(proxy.key)
            held = self._held.get(proxy.key)
            if held is None:
                dirty |= self._declare(PackedProxy(proxy), proxy, proxy_spec_hash(proxy), good=True)
                continue
            if held.good is None:
                held.good = PlannedProxy(proxy=proxy, spec_hash=proxy_spec_hash(proxy))
            dirty |= self._settle(held)
        return dirty

    def mark_applied(self, plan: StackPlan) -> None:
        """An `up` of this plan succeeded: its proxies are now applied."""
        self._applied.update_keys(planned.key for planned in plan.proxies)

    # --- queries ----------------------------------------------------------------------------------------

    def stacks(self) -> set[str]:
        """Every stack that some proxy is placed in or that the catalogue lists."""
        named = {name for name, keys in self._by_stack.items() if keys}
        return named | set(self.catalogue.names())

    def is_applied(self, key: str) -> bool:
        return key in self._applied

    def applied_keys(self) -> set[str]:
        return set(self._applied)

    def current(self, key: str) -> Proxy | None:
        """The version the planner holds for `key`: declared, deleting, or (not declared yet) applied."""
        held = self._held.get(key)
        return None if held is None else held.packed.proxy

    def holds(self, key: str) -> bool:
        """Does the planner hold a version of `key` (`current` without decoding it)?"""
        return key in self._held

    def applied_count(self) -> int:
        """Proxies some stack holds and that are not leaving: the fleet a deletion is measured against."""
        held = self._held
        return sum(1 for key in self._applied if key in held and not held[key].packed.deleting)

    def held_version(self, key: str) -> PlannedProxy | None:
        """The last good version a rejected proxy runs at, None when it is not held."""
        held = self._held.get(key) if key in self.rejected else None
        return held.good if held is not None and held.home else None

    def plan(self, name: str) -> StackPlan:
        entry = self.catalogue.get(name)
        view = self._refreshed(name)
        live = view.ordered()
        deleting: list[Proxy] = []
        forget: list[Proxy] = []
        for key in sorted(view.leaving):
            proxy = self._held[key].packed.proxy  # decoded for each plan: a caller may keep and change it
            (forget if wants_skip_cleanup(proxy) else deleting).append(proxy)
        spec_hash = ""
        if entry is not None:
            if view.entry is not entry:
                view.entry, view.entry_text = entry, entry_hash_text(entry)
            spec_hash = stack_spec_hash_joined(view.entry_text, view.joined())
        return StackPlan(
            name=name,
            entry=entry,
            proxies=tuple(live.values()),
            deleting=tuple(deleting),
            forget=tuple(forget),
            spec_hash=spec_hash,
        )

    def plan_all(self) -> dict[str, StackPlan]:
        return {name: self.plan(name) for name in sorted(self.stacks())}

    # --- internals --------------------------------------------------------------------------------------

    def _touch(self, key: str, *stacks: str | None) -> None:
        """`key`'s entry in these stacks' views must be worked out again at their next plan. A stack with no
        view yet needs no mark: its first plan works out every key placed in it."""
        for name in stacks:
            view = self._views.get(name) if name else None
            if view is not None:
                view.stale.add(key)

    def _refreshed(self, name: str) -> StackView:
        """The stack's view with every touched key worked out again (every key, for a stack not yet seen)."""
        view = self._views.get(name)
        if view is None:
            view = self._views[name] = StackView()
            view.stale.update(self._by_stack.get(name, ()))
        if not view.stale:
            return view
        members = self._by_stack.get(name) or KeySet()
        for key in view.stale:
            view.leaving.discard(key)
            planned = None
            if key in members:
                held = self._held[key]
                if held.packed.deleting:
                    view.leaving.add(key)
                else:
                    planned = self._usable(held)
            view.put(key, planned)
        view.stale.clear()
        return view

    def _usable(self, held: _Held) -> PlannedProxy | None:
        error = self.rejected.get(held.packed.key)
        if error is None:
            # A new object, not the last good one its validation made: made as its stack is planned, next
            # to its stack's others, so a plan reads one stack's entries from memory close together.
            return PlannedProxy(proxy=held.packed, spec_hash=held.spec_hash)
        if error.reason == Reason.NAME_COLLISION:
            return None  # never applied (an applied proxy is never refused for this): nothing to hold
        return held.good

    def _settle(self, held: _Held, proxy: Proxy | None = None) -> set[str]:
        """Validate the proxy (`proxy`: its model, when the caller has it) and place it in the stack its
        effective version belongs to."""
        key = held.packed.key
        self._validate(held, proxy if proxy is not None else held.packed.proxy)
        old = held.home
        new = held.home = self._placement(held)
        self._touch(key, old, new)
        if old == new:
            return {new} if new else set()
        if old is not None:
            self._by_stack[old].discard(key)
        if new is not None:
            self._by_stack[new].add(key)
        return {name for name in (old, new) if name}

    def spec_hash_of(self, key: str) -> str | None:
        """The spec hash of the proxy as declared now (None: not declared); its status's observed hash is
        what its stack applied, so the two differ while an update is pending or held."""
        held = self._held.get(key)
        return None if held is None else held.spec_hash

    def stack_of(self, key: str) -> str | None:
        """The stack a proxy's resources are in or go to (None: nowhere yet)."""
        held = self._held.get(key)
        return None if held is None else held.home

    def _placement(self, held: _Held) -> str | None:
        """Where a proxy's resources are or go: a leaving or held proxy stays where its last good version
        is (an unknown provider holds it on its old stack); a valid one goes to its provider."""
        proxy, good = held.packed, held.good
        if proxy.deleting or proxy.key in self.rejected:
            if good is not None:
                return good.packed.provider
            return proxy.provider if proxy.deleting else None
        return proxy.provider

    def _validate(self, held: _Held, proxy: Proxy) -> None:
        key = held.packed.key  # the packed copy's string, not one more
        if is_deleting(proxy):
            self.rejected.pop(key, None)  # leaving: only the provider's existence matters (reconciler)
            return
        problems = proxy_problems(proxy, self.catalogue)
        winner = self._flat_name_owner(proxy)
        if winner is not None and winner != key:
            problems.append(_collision(proxy, winner))
        if not problems:
            self.rejected.pop(key, None)
            held.good = PlannedProxy(proxy=held.packed, spec_hash=held.spec_hash)
            return
        message = "; ".join(f"{p.path}: {p.message}" for p in problems)
        unknown = self.catalogue.get(proxy.spec.provider) is None
        kind = UnknownProviderError if unknown else InvalidInputError
        reason = Reason.NAME_COLLISION if winner is not None and winner != key else None
        # One refusal (an unknown provider) is often the same for thousands of Proxies: one error for all.
        error = self._errors.get((kind, message, reason))
        if error is None:
            error = self._errors[(kind, message, reason)] = kind(message, reason=reason)
        self.rejected[key] = error

    def _flat_name_owner(self, proxy: Proxy) -> str | None:
        """Of the live proxies sharing a flat physical name, the one that keeps it: an applied one first,
        then the smallest key. None when the name is not shared, or when this proxy is applied (two applied
        proxies evidently do not collide: refusing one would delete it)."""
        if proxy.key in self._applied:
            return None
        held = self._held
        group = [
            k
            for k in self._by_flat_name.get(flat_name(proxy)) | {proxy.key}
            if k in held and not held[k].packed.deleting
        ]
        if len(group) < 2:
            return None
        return min(group, key=lambda k: (k not in self._applied, k))

    def _revalidate_group(self, flat: str, key: str) -> set[str]:
        dirty: set[str] = set()
        for other in sorted(self._by_flat_name.get(flat) - {key}):
            held = self._held.get(other)
            if held is not None:
                dirty |= self._settle(held)
        return dirty

    def _regroup(self, flat: str, key: str) -> set[str]:
        if flat not in self._by_flat_name:
            return set()
        self._by_flat_name.discard(flat, key)
        return self._revalidate_group(flat, key)


def flat_name(proxy: Proxy) -> str:
    """The `<namespace>-<name>` that providers with flat names (VMs, processes, Deployments in one
    namespace) derive physical names from: `a-b/c` and `a/b-c` share it."""
    return f"{proxy.metadata.namespace}-{proxy.metadata.name}"


def _collision(proxy: Proxy, winner: str) -> FieldProblem:
    return FieldProblem(
        "metadata.name",
        f"{proxy.key} and {winner} would get the same physical names ({flat_name(proxy)}) from providers "
        f"that name resources <namespace>-<name>: {winner} keeps it; rename this Proxy or its namespace",
    )
