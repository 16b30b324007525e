"""The one Pulumi CLI runner (`PulumiAt`) of an engine and its term views, made on the first CLI call any of
them makes (making it imports the SDK: a follower never does), and the CLI's version read ahead."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from automation.engine.config import cli_version

if TYPE_CHECKING:
    from automation.engine.command import PulumiAt

log = logging.getLogger(__name__)


class Runner:
    """The one `PulumiAt` of an engine and its term views, made on the first CLI call any of them makes."""

    def __init__(self, cli: Path, *, fenced: bool) -> None:
        self.cli, self.fenced = cli, fenced
        self._made: PulumiAt | None = None
        self._lock = threading.Lock()  # operations run in threads: one `pulumi version`, one runner
        self._version: Future[str] | None = None  # read ahead by `prefetch`

    def prefetch(self) -> None:
        """Read the CLI's version now, in a thread of its own (a CLI call, not the SDK), so that the first
        operation does not wait for it. Once; a failure is the first operation's to report (read again)."""
        with self._lock:
            if self._version is not None or self._made is not None:
                return
            self._version = version = Future[str]()

        def read() -> None:
            try:
                version.set_result(cli_version(self.cli))
            except BaseException as exc:  # handed to `get`, which reads again
                version.set_exception(exc)

        threading.Thread(target=read, name="pulumi-version", daemon=True).start()

    def seed(self, version: str) -> None:
        """The CLI's version as another process read it (an engine host's service): not read again."""
        with self._lock:
            if self._version is None and self._made is None:
                self._version = Future[str]()
                self._version.set_result(version)

    def known_version(self) -> str | None:
        """The version read ahead, when it is in (without waiting)."""
        with self._lock:
            read = self._version
            made = self._made
        if made is not None:
            return str(made.version)
        if read is not None and read.done() and read.exception() is None:
            return read.result()
        return None

    def get(self) -> PulumiAt:
        with self._lock:
            if self._made is None:
                from automation.engine.command import PulumiAt  # the SDK: `PulumiAt` extends its runner

                read_ahead = None
                if self._version is not None:
                    try:
                        read_ahead = self._version.result()
                    except Exception:  # read again below, where the failure is raised
                        log.debug("the CLI's version read ahead failed", exc_info=True)
                self._made = PulumiAt(self.cli, fenced=self.fenced, version=read_ahead)
            return self._made
