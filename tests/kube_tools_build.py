"""`make kube-tools` running beside the suite (scripts/test.sh): the tests that need its programs wait for it.

On a machine with the tools cached, `make kube-tools` links them in seconds, before the first test that needs
them. On a cold machine it builds kube-apiserver, the Kubernetes provider plugin and the test node's programs
with Go (about 35 minutes of two cores' time): scripts/test.sh runs it in the background at low priority, and
the suite runs meanwhile. When it is still building at the end of collection, the tests that need its
programs (below) move to the end of the run, in their order, those that need only the API server's parts
(`make kube-api-tools`, built first) before those that need the test node; each waits for its part of the
build before its setup; a failed build fails them (never skips) with the end of its log.

A test needs the node's programs when it uses the `kube_node` fixture, and the API server's when it uses
`kube_api` (tests/kube/conftest.py) or is marked `kube_tools` (those that start kube-apiserver or call the
plugin themselves). Without scripts/test.sh (`pytest` run by
hand), there is no build to wait for: the tools are expected in place, as before.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

SHARE_ENV = "PROXY_OPERATOR_TEST_SHARE"  # scripts/test.sh: "node" (the test node's tests) or "rest"
STATUS_ENV = "PROXY_OPERATOR_KUBE_TOOLS_STATUS"  # the file scripts/test.sh writes the build's exit code to
API_STATUS_ENV = "PROXY_OPERATOR_KUBE_API_TOOLS_STATUS"  # the same once kube-api-tools ended
LOG_ENV = "PROXY_OPERATOR_KUBE_TOOLS_LOG"
API, NODE = "api", "node"
SETTLE_SECONDS = 30.0  # a build that only links cached programs ends well within this
PROGRESS_SECONDS = 60.0
LOG_LINES = 30


def needs(item: pytest.Item) -> str | None:
    """Which part of the build the test needs: NODE, API or None."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if "kube_node" in fixtures:
        return NODE
    if "kube_api" in fixtures or item.get_closest_marker("kube_tools") is not None:
        return API
    return None


def share(items: list[pytest.Item], which: str) -> list[pytest.Item]:
    """Keep in `items` the tests of one share of the suite: "node", the tests that need the test node, or
    "rest", every other; the ones left out, returned. scripts/test.sh runs the two shares as two pytest
    processes side by side: the node's tests mostly wait (on pods, rollouts, the provider's awaits), so they
    cost the run their CPU time, not their length."""
    if which not in (NODE, "rest"):
        raise pytest.UsageError(f"{SHARE_ENV}={which!r}: expected {NODE!r} or 'rest'")
    kept, left = [], []
    for item in items:
        (kept if (needs(item) == NODE) == (which == NODE) else left).append(item)
    items[:] = kept
    return left


@dataclass
class BackgroundBuild:
    status: Path
    log: Path
    api_status: Path | None = None  # None: one status for every part

    @classmethod
    def from_env(cls) -> BackgroundBuild | None:
        status, log, api = (os.environ.get(k) for k in (STATUS_ENV, LOG_ENV, API_STATUS_ENV))
        if not status:
            return None
        return cls(Path(status), Path(log or os.devnull), Path(api) if api else None)

    def exit_code(self, part: str = NODE) -> int | None:
        """The exit code of the build up to `part` (NODE: all of it) once that ended; None while it runs."""
        path = self.api_status if part == API and self.api_status is not None else self.status
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            return None
        if not text:
            return None  # scripts/test.sh moves a whole file in place; this is someone's half-written one
        return int(text) if text.lstrip("-").isdigit() else 1

    def wait(
        self,
        part: str = NODE,
        *,
        within: float | None = None,
        say: Callable[[str], None] = lambda _: None,
    ) -> int | None:
        """The exit code of `part`, waiting for it up to `within` seconds (None: as long as it runs)."""
        started = last = time.monotonic()
        while (code := self.exit_code(part)) is None:
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
    """Move the items that need the tools to the end, those needing the API server's parts before those
    needing the node, keeping each group's order; how many moved."""
    groups: dict[str | None, list[pytest.Item]] = {None: [], API: [], NODE: []}
    for item in items:
        groups[needs(item)].append(item)
    items[:] = groups[None] + groups[API] + groups[NODE]
    return len(groups[API]) + len(groups[NODE])
