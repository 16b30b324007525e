"""The leader's credentials Secrets, written off the event loop: `submit` queues, a thread applies.

`Reporter.publish` runs on the event loop for every proxy of an applied stack, and a Secret's apply is a
blocking call to the apiserver (10-60 ms when it is busy): a new leader's first `up`s, 500 proxies a stack,
held the loop for 9-30 s each time (the stall watch in bench_running, docs/operations.md run 36), and every
lease and probe waited behind them. Here the loop only queues (the latest credentials of each Proxy win, one
write however often it was published meanwhile); one thread applies them through `CredentialsWriter`
(which skips what it wrote already), oldest first.

- Only a leader writes: what a replica that stepped down had queued is dropped, as the status writer drops
  its marks (a write in flight when the term ends completes, as one made just before it would have).
- A failed write is logged and left to the next publish of that Proxy (each stack `up` and resync publishes
  all of its proxies), as when the loop made the call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from service.kube.credentials import Credentials, CredentialsWriter
from service.kube.refs import ProxyRef
from service.kube.worker import Worker

log = logging.getLogger(__name__)


class CredentialsPublisher(Worker):
    thread_name = "credentials-writer"

    def __init__(self, writer: CredentialsWriter) -> None:
        super().__init__()
        self.writer = writer
        self.leading: Callable[[], bool] = lambda: True
        self._pending: dict[str, tuple[ProxyRef, Credentials]] = {}  # uid -> the latest, oldest first
        self.dropped = 0  # queued writes a replica no longer leading dropped (tests, logs)

    def start(self) -> None:
        self._start_thread()

    def submit(self, ref: ProxyRef, credentials: Credentials) -> None:
        """Queue the Proxy's credentials for its Secret; never blocks on the apiserver."""
        with self._cond:
            self._pending.pop(ref.uid, None)  # a newer publish replaces one not written yet
            self._pending[ref.uid] = (ref, credentials)
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def wait_idle(self, timeout: float) -> bool:
        """Until nothing is queued or being written (tests); False at the timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def _worker(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._stop)
                if self._stop:
                    return
                if not self.leading():
                    self.dropped += len(self._pending)
                    log.info("not leading: %d queued credentials Secret writes dropped", len(self._pending))
                    self._pending.clear()
                    self._cond.notify_all()
                    continue
                uid = next(iter(self._pending))
                ref, credentials = self._pending.pop(uid)
                self._busy = True
            try:
                self.writer.write(ref, credentials)
            except Exception as exc:  # the next publish writes it; discovery on the leader has it already
                log.warning("cannot write the credentials Secret of %s: %s", ref.key, exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
