"""A background writer's thread: one daemon thread, a condition its producers notify, and a clean stop.

The status writer and the Event recorder share this life cycle; each brings its own `_worker` loop, which
waits on `_cond`, returns once `_stop` is set, and sets `_busy` while it writes (for `wait_idle`).
"""

from __future__ import annotations

import threading


class Worker:
    thread_name = "worker"

    def __init__(self) -> None:
        self._busy = False
        self._stop = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._worker, name=self.thread_name, daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def _worker(self) -> None:
        raise NotImplementedError
