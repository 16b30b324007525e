"""`grant` answers as its general case does, for every request: its shortcut (nothing to lower) only skips
the work."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from service.discovery.limits import grant, lowering
from service.settings import DiscoverySettings

SETTINGS = DiscoverySettings(
    max_count=10, lease_ttl_seconds=60, lease_ttl_max_seconds=600, max_wait_seconds=5
)


@given(
    count=st.integers(1, 20),
    ttl=st.none() | st.floats(0, 2000, allow_nan=False) | st.sampled_from([600.0, 600.0000001]),
    wait=st.floats(0, 30, allow_nan=False) | st.sampled_from([5.0, 5.000001]),
)
def test_grant_is_its_general_case(count: int, ttl: float | None, wait: float) -> None:
    got = grant(count=count, ttl=ttl, wait=wait, settings=SETTINGS)
    assert got == lowering(count=count, ttl=ttl, wait=wait, settings=SETTINGS)
    assert type(got.count) is int
