"""Fixtures of the pool tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.automation.fleet import Fleet
from tests.conftest import PulumiEnv


@pytest.fixture
def fleet_ab(pulumi_env: PulumiEnv, tmp_path: Path) -> Iterator[Fleet]:
    """A `local` fleet with two providers, a and b; every proxy it started is stopped afterwards."""
    fleet = Fleet(root=tmp_path, backend_url=pulumi_env.backend_url, providers=["a", "b"])
    yield fleet
    fleet.kill_proxies()
