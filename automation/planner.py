"""Desired proxies + catalogue -> one stack plan per provider instance, incrementally.

The planner keeps every proxy's hash and the set of proxies per stack, so that a change to one proxy costs
work proportional to its stack, not to the fleet: `upsert`/`remove` say which stacks got dirty and `plan`
recomputes only the stack asked for. A proxy that fails validation is left out with its reason; if an
earlier version of it was valid, that last good version stays in the stack (a typo must not delete a
running proxy), and the rejection is still reported.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from automation.errors import InvalidInputError, PermanentError, UnknownProviderError
from stacks.models import ProviderCatalogue, ProviderEntry, Proxy
from stacks.spec_hash import proxy_spec_hash, stack_spec_hash
from stacks.validation import proxy_problems

SKIP_CLEANUP = "crawl.example.com/skip-cleanup"


def wants_skip_cleanup(proxy: Proxy) -> bool:
    return proxy.metadata.annotations.get(SKIP_CLEANUP, "").strip().lower() == "true"


def is_deleting(proxy: Proxy) -> bool:
    return proxy.metadata.deletion_timestamp is not None


@dataclass(frozen=True)
class PlannedProxy:
    proxy: Proxy
    spec_hash: str

    @property
    def key(self) -> str:
        return self.proxy.key


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


@dataclass
class Planner:
    catalogue: ProviderCatalogue = field(default_factory=ProviderCatalogue)
    _proxies: dict[str, Proxy] = field(default_factory=dict)
    _hashes: dict[str, str] = field(default_factory=dict)
    _last_good: dict[str, PlannedProxy] = field(default_factory=dict)
    _by_stack: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    rejected: dict[str, PermanentError] = field(default_factory=dict)

    # --- changes ----------------------------------------------------------------------------------------

    def set_catalogue(self, catalogue: ProviderCatalogue) -> set[str]:
        """Replace the catalogue; returns the stacks whose entry changed (their hash includes it)."""
        old = {entry.name: entry for entry in self.catalogue.providers}
        new = {entry.name: entry for entry in catalogue.providers}
        self.catalogue = catalogue
        dirty = {name for name in old.keys() | new.keys() if old.get(name) != new.get(name)}
        for key in [k for k, proxy in self._proxies.items() if proxy.spec.provider in dirty]:
            self._validate(self._proxies[key])
        return dirty

    def upsert(self, proxy: Proxy) -> set[str]:
        """Add or change a proxy; returns the stacks to re-plan (old and new provider)."""
        key = proxy.key
        previous = self._proxies.get(key)
        self._proxies[key] = proxy
        dirty = {proxy.spec.provider}
        if previous is not None and previous.spec.provider != proxy.spec.provider:
            self._by_stack[previous.spec.provider].discard(key)
            dirty.add(previous.spec.provider)
        self._by_stack[proxy.spec.provider].add(key)
        self._hashes[key] = proxy_spec_hash(proxy)
        self._validate(proxy)
        return dirty

    def remove(self, key: str) -> set[str]:
        """Forget a released proxy entirely."""
        proxy = self._proxies.pop(key, None)
        self._hashes.pop(key, None)
        self._last_good.pop(key, None)
        self.rejected.pop(key, None)
        if proxy is None:
            return set()
        self._by_stack[proxy.spec.provider].discard(key)
        return {proxy.spec.provider}

    def remember_applied(self, proxies: list[Proxy]) -> None:
        """Seed last-good versions from what a stack last applied (read back after a restart)."""
        for proxy in proxies:
            if proxy.key not in self._last_good:
                self._last_good[proxy.key] = PlannedProxy(proxy=proxy, spec_hash=proxy_spec_hash(proxy))

    # --- queries ----------------------------------------------------------------------------------------

    def stacks(self) -> set[str]:
        """Every stack that some proxy names or that the catalogue lists."""
        named = {name for name, keys in self._by_stack.items() if keys}
        return named | set(self.catalogue.names())

    def plan(self, name: str) -> StackPlan:
        entry = self.catalogue.get(name)
        live: list[PlannedProxy] = []
        deleting: list[Proxy] = []
        forget: list[Proxy] = []
        for key in sorted(self._by_stack.get(name, ())):
            proxy = self._proxies[key]
            if is_deleting(proxy):
                (forget if wants_skip_cleanup(proxy) else deleting).append(proxy)
                continue
            planned = self._usable(proxy)
            if planned is not None:
                live.append(planned)
        spec_hash = ""
        if entry is not None:
            spec_hash = stack_spec_hash(entry, {p.key: p.spec_hash for p in live})
        return StackPlan(
            name=name,
            entry=entry,
            proxies=tuple(live),
            deleting=tuple(deleting),
            forget=tuple(forget),
            spec_hash=spec_hash,
        )

    def plan_all(self) -> dict[str, StackPlan]:
        return {name: self.plan(name) for name in sorted(self.stacks())}

    # --- internals --------------------------------------------------------------------------------------

    def _usable(self, proxy: Proxy) -> PlannedProxy | None:
        if proxy.key not in self.rejected:
            return PlannedProxy(proxy=proxy, spec_hash=self._hashes[proxy.key])
        good = self._last_good.get(proxy.key)
        if good is None or good.proxy.spec.provider != proxy.spec.provider:
            return None
        return good

    def _validate(self, proxy: Proxy) -> None:
        key = proxy.key
        if is_deleting(proxy):
            self.rejected.pop(key, None)  # leaving: only the provider's existence matters (reconciler)
            return
        problems = proxy_problems(proxy, self.catalogue)
        if not problems:
            self.rejected.pop(key, None)
            self._last_good[key] = PlannedProxy(proxy=proxy, spec_hash=self._hashes[key])
            return
        message = "; ".join(f"{p.path}: {p.message}" for p in problems)
        unknown = self.catalogue.get(proxy.spec.provider) is None
        self.rejected[key] = (UnknownProviderError if unknown else InvalidInputError)(message)
