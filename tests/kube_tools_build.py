"""`make kube-tools` running beside the suite (scripts/test.sh): the tests that need its programs wait for it.

On a machine with the tools cached, `make kube-tools` links them in seconds, before the first test that needs
them. On a cold machine it builds kube-apiserver, the Kubernetes provider plugin and the test node's programs
with Go (about 35 minutes of two cores' time): scripts/test.sh runs it in the background at low priority, and
the suite runs meanwhile. When it is still building at the end of collection, the tests that need its
programs (below) move to the end of the run, in their order, and each waits for the build before its setup;
a failed build fails them (never skips) with the end of its log.

A test needs the tools when it uses the `kube_api` or `kube_node` fixture (tests/kube/conftest.py) or is
marked `kube_tools` (those that start the programs themselves). Without scripts/test.sh (`pytest` run by
hand), there is no build to wait for: the tools are expected in place, as before.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

STATUS_ENV = "PROXY_OPERATOR_KUBE_TOOLS_STATUS"  # the file scripts/test.sh writes the build's exit code to
LOG_ENV = "PROXY_OPERATOR_KUBE_TOOLS_LOG"
FIXTURES = frozenset({"kube_api", "kube_node"})
SETTLE_SECONDS = 30.0  # a build that only links cached programs ends well within this
PROGRESS_SECONDS = 60.0
LOG_LINES = 30


def needs_tools(item: pytest.Item) -> bool:
    return item.get_closest_marker("kube_tools") is not None or bool(
        FIXTURES & set(getattr(item, "fixturenames", ()))
    )


@dataclass
class BackgroundBuild:
    status: Path
    log: Path

    @classmethod
    def from_env(cls) -> BackgroundBuild | None:
        status, log = os.environ.get(STATUS_ENV), os.environ.get(LOG_ENV)
        return cls(Path(status), Path(log or os.devnull)) if status else None

    def exit_code(self) -> int | None:
        """The build's exit code once it ended; None while it runs."""
        try:
            text = self.status.read_text().strip()
        except FileNotFoundError:
            return None
        return int(text) if text.lstrip("-").isdigit() else 1

    def wait(self, *, within: float | None = None, say: Callable[[str], None] = lambda _: None) -> int | None:
        """The exit code, waiting for the build up to `within` seconds (None: as long as it runs)."""
        started = last = time.monotonic()
        while (code := self.exit_code()) is None:
            now = time.monotonic()
            if within is not None and now - started >= within:
                return None
            if now - last >= PROGRESS_SECONDS:
                last = now
                say(f"waiting for `make kube-tools` ({now - started:.0f} s so far): {self.last_line()}")
            time.sleep(1.0)
        return code

    def last_line(self) -> str:
        lines = self.tail(1)
        return lines[0] if lines else "(nothing logged yet)"

    def tail(self, count: int = LOG_LINES) -> list[str]:
        try:
            return self.log.read_text(errors="replace").splitlines()[-count:]
        except OSError:
            return []

    def failure(self, code: int) -> str:
        lines = "\n".join(f"  {line}" for line in self.tail())
        return f"`make kube-tools` failed (exit {code}); the end of {self.log}:\n{lines}"


def run_last(items: list[pytest.Item]) -> int:
    """Move the items that need the tools to the end, keeping both groups' order; how many moved."""
    later = [item for item in items if needs_tools(item)]
    items[:] = [item for item in items if not needs_tools(item)] + later
    return len(later)
