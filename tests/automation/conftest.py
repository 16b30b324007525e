"""Fixtures of the real-engine automation tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.automation.fleet import Fleet
from tests.conftest import PulumiEnv


@pytest.fixture
def fleet(pulumi_env: PulumiEnv, tmp_path: Path) -> Iterator[Fleet]:
    """A `local` fleet on the test's backend; every proxy it started is stopped afterwards."""
    fleet = Fleet(root=tmp_path, backend_url=pulumi_env.backend_url)
    yield fleet
    fleet.kill_proxies()
