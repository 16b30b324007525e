"""A term's first pass over the fleet, and the backend read it rests on (the control loop's part that runs
at start, `Controller.start`).

The catalogue comes first (ownership is judged by it). Then the lane: the few Proxies with a real change and
the other Proxies of their stacks are judged, their stacks read and run while the rest is judged in slices
(`Controller._sync_slices`) beside the backend read. Every stack of ours is read before anything is decided
about it; a stack that cannot be read holds the deletions no read shows. Decisions: docs/decisions.md, "The
intake (issue 20)".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection

from automation.engine import Engine
from automation.errors import PermanentError, ProxyOperatorError, StackNotOwnedError
from automation.planner import Planner, is_deleting
from automation.queue import WorkQueue
from automation.reconciler import Reconciler
from service.config import OperatorSettings
from service.reporter import Reporter
from service.sources.contract import Lane, SlicedSource, Source
from stacks.models import Proxy

log = logging.getLogger("service.controller")  # the control loop's log, as before the split

REREAD_SECONDS = 30.0  # a stack whose read failed for good is read again this often
REPORT_SLICE = 200  # refused Proxies reported again between two turns of the event loop, after the read


class FirstPass:
    """The first pass and the backend read of `Controller` (its state lives there)."""

    settings: OperatorSettings
    engine: Engine
    source: Source
    planner: Planner
    reporter: Reporter
    reconciler: Reconciler
    queue: WorkQueue
    started: bool
    _foreign: set[str]
    _unread: set[str]
    _reread_at: float
    _backend_seen: bool
    _monotonic: Callable[[], float]
    _last_repair: dict[str, float]
    _lanes: set[asyncio.Task[None]]
    _reading: dict[str, asyncio.Future[list[Proxy] | None]]

    def sync(self, *, only: Collection[str] | None = None, submit: bool = True) -> set[str]:
        raise NotImplementedError

    async def _sync_slices(self, *, submit: bool = True) -> set[str]:
        raise NotImplementedError

    def _hint(self, name: str) -> object:
        raise NotImplementedError

    async def start(self) -> None:
        """First load: the catalogue (ownership is judged by it); the stacks with a real change, read and run
        ahead of the rest (`_lane`); what the backend applied, read while the fleet is judged in slices;
        the source again (absence judged against what runs); every known stack is submitted once."""
        began = self._monotonic()
        # The list of stacks needs no input: its CLI call runs while the first sync judges the fleet.
        listing = asyncio.get_running_loop().run_in_executor(None, self.engine.list_stack_names)
        if not isinstance(self.source, SlicedSource):
            try:
                self.sync()
            except BaseException:
                listing.cancel()  # its answer is not wanted: this pass is tried again whole
                raise
            await self._load_backend(listing)
        else:
            reading: asyncio.Task[None] | None = None
            try:
                self.sync(only=(), submit=False)  # the catalogue alone
                self._take_lane(self.source.lane())
                reading = asyncio.create_task(self._load_backend(listing), name="backend-read")
                await self._sync_slices(submit=False)
                await reading
            except BaseException:
                listing.cancel()
                for task in (reading, *self._lanes):
                    if task is not None:
                        task.cancel()
                await asyncio.gather(*(t for t in (reading, *self._lanes) if t), return_exceptions=True)
                raise
        await self._sync_slices()
        await self._submit_known_stacks()
        self.started = True
        if self._backend_seen:
            log.info(
                "first pass done in %.1f s: every stack read, changes run now", self._monotonic() - began
            )

    def _take_lane(self, lane: Lane | None) -> None:
        """Judge a lane's Proxies now (see Lane), and read and run its stacks beside the rest."""
        if lane is None:
            return
        self.sync(only=lane.keys, submit=False)
        task = asyncio.create_task(self._run_lane(lane), name="lane")
        self._lanes.add(task)
        task.add_done_callback(self._lanes.discard)

    async def _run_lane(self, lane: Lane) -> None:
        """Read the lane's stacks (shared with the backend read's own read of them), then submit each: its
        Proxies are all judged."""
        names = sorted(name for name in lane.stacks if name not in self._foreign)
        try:
            read = await self._read_stacks(names)
        except Exception:  # the backend read meets the same fault, and says so
            log.debug("a lane's read failed", exc_info=True)
            return
        if not read:
            return
        for name in names:
            if name not in self._foreign and name not in self._unread:
                log.info(
                    "stack %s has a change: run before the rest is taken in",
                    name,
                    extra={"fields": {"stack": name}},
                )
                self.queue.submit(name, generation_hint=self._hint(name))

    async def _load_backend(self, listing: Awaitable[list[str]] | None = None) -> None:
        """Read every stack's ownership and applied proxies, `max_parallel` stacks at a time; the source
        learns the applied ones, so a complete read that lacks one declares its deletion and an incomplete
        one holds it. A stack that cannot be read now fails the whole read (none is acted on, all is read
        again at the next poll); one that waits for a fix is left out (its runs say why) and read again
        every REREAD_SECONDS: until it reads, nothing is decided about a deleting Proxy that no stack read
        shows (it may run in that one)."""
        try:
            names = await (listing or asyncio.to_thread(self.engine.list_stack_names))
        except ProxyOperatorError as exc:
            # The backend is unreachable or refuses us (credentials, passphrase): nothing is planned
            # without what it holds; tried again at the next poll.
            log.error("cannot list the stacks of the backend: %s", exc.message)
            return
        if self._lanes:  # a real change's stacks are read first: the bulk's CLI calls wait for theirs
            await asyncio.gather(*list(self._lanes), return_exceptions=True)
        if not await self._read_stacks(names):
            return
        self._backend_seen = True
        self._backend_complete()
        # A rejected proxy may run an applied version after all. Up to every Proxy of the fleet (10,000
        # Stalled ones): reported a slice at a time, the event loop served between two (Lease renewals).
        for done, key in enumerate(sorted(self.planner.rejected), start=1):
            current = self.planner.current(key)
            if current is not None:
                self.reporter.report_validity(key, deleting=is_deleting(current))
            if done % REPORT_SLICE == 0:
                await asyncio.sleep(0)

    async def _read_stacks(self, names: list[str]) -> bool:
        """Read these stacks at once (`max_parallel` at a time); False when one could not be read now."""
        limit = asyncio.Semaphore(self.settings.max_parallel)
        reads = await asyncio.gather(
            *(self._read_stack(name, limit) for name in names), return_exceptions=True
        )
        failed: BaseException | None = None
        for name, read in zip(names, reads, strict=True):
            if isinstance(read, BaseException):
                failed = failed or read
            elif read is not None:
                self._learn_applied(name, read)
        if isinstance(failed, ProxyOperatorError):
            log.error("cannot read the stacks of the backend: %s", failed.message)
            return False
        if failed is not None:
            raise failed
        return True

    async def _read_stack(self, name: str, limit: asyncio.Semaphore) -> list[Proxy] | None:
        """One stack's ownership and applied proxies; None for a stack left alone (not ours) or one that
        waits for a fix (in `_unread`). A read of a stack already under way (a lane's) is shared."""
        task = self._reading.get(name)
        if task is None:
            task = self._reading[name] = asyncio.ensure_future(self._read_stack_once(name, limit))
            task.add_done_callback(lambda _: self._reading.pop(name, None))
        return await asyncio.shield(task)

    async def _read_stack_once(self, name: str, limit: asyncio.Semaphore) -> list[Proxy] | None:
        async with limit:
            try:
                applied = await self.reconciler.load_stack(name)
            except StackNotOwnedError:
                self._foreign.add(name)
                return None
            except PermanentError as exc:
                log.error("stack %s: %s", name, exc.message, extra={"fields": {"stack": name}})
                self._unread.add(name)
                return None
        self._unread.discard(name)
        return applied or self.reconciler.applied(name)  # [] also when a run of the queue read it first

    def _backend_complete(self) -> None:
        """Every stack of ours was read: only now may the source decide anything destructive (a deleting
        Proxy it does not know)."""
        if self._unread:
            self._reread_at = self._monotonic() + REREAD_SECONDS
            log.error(
                "stacks %s cannot be read: a deleting Proxy that no stack read shows keeps its finalizer "
                "until they read (tried again every %.0f s)",
                ", ".join(sorted(self._unread)),
                REREAD_SECONDS,
            )
            return
        self.source.backend_loaded()

    async def _reread(self) -> None:
        if (
            self._unread
            and self._monotonic() >= self._reread_at
            and await self._read_stacks(sorted(self._unread))
        ):
            self._backend_complete()

    def _learn_applied(self, name: str, applied: list[Proxy]) -> None:
        self.source.track(applied)
        self.reporter.publish_applied(name, applied, self.reconciler.applied_outputs(name))
        if self.reconciler.drift_check_due(name):
            self._last_repair[name] = self._monotonic()  # its first run checks it already

    async def _submit_known_stacks(self) -> None:
        """Submit every stack of ours -- once the backend was read and there is a catalogue to judge by."""
        if not self._backend_seen:
            return
        if self.source.catalogue is None:
            log.error("no provider catalogue in the manifests yet: no stack is reconciled until there is one")
            return
        # A foreign stack our catalogue names is submitted too: its run fails, naming the owner.
        for name in sorted(self.planner.stacks()):
            self.queue.submit(name, generation_hint=self._hint(name))
