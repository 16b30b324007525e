"""The forward proxy's parts without a process: its limits in the config file, the connection counts per
source and in all, the descriptor budget, who a login is, and the tethers that cut a lease user's
connections (on the real event loop, with short ends). The behaviour on real processes is in
`tests/security/test_forward_proxy_limits.py` and `tests/security/test_lease_connections.py`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from stacks.forward_proxy.config import Limits, ProxyConfig
from stacks.forward_proxy.occupancy import Full, Occupancy, source_of
from stacks.forward_proxy.tethers import Tethers
from stacks.forward_proxy.users import Gate, LeaseUsers, Login
from stacks.models import EgressSpec

BEFORE_LIMITS = {"bind": "127.0.0.1", "port": 3128, "protocol": "http", "egress": {}, "username": "u"}


def _read(tmp_path: Path, raw: dict[str, object]) -> ProxyConfig:
    path = tmp_path / "proxy.json"
    path.write_text(json.dumps(raw))
    return ProxyConfig.read(path)


def test_a_config_file_from_before_the_limits_reads_with_the_defaults(tmp_path: Path) -> None:
    limits = _read(tmp_path, BEFORE_LIMITS).limits
    assert limits == Limits(
        head_seconds=10, handshake_seconds=10, idle_seconds=300, per_source=256, total=1024
    )


def test_limits_are_read_each_on_its_own_and_written_back(tmp_path: Path) -> None:
    config = _read(tmp_path, {**BEFORE_LIMITS, "limits": {"head_seconds": 1.5, "per_source": 8}})
    assert config.limits == Limits(head_seconds=1.5, per_source=8)
    config.write(tmp_path / "again.json")
    assert ProxyConfig.read(tmp_path / "again.json") == config


@pytest.mark.parametrize(
    "limits",
    [
        *({"head_seconds": 0}, {"idle_seconds": -1}, {"idle_seconds": "300"}),
        *({"handshake_seconds": float("inf")}, {"per_source": 0}, {"total": 2.5}, {"total": True}),
        {"head": 10},
    ],
)
def test_a_bad_limit_is_refused_at_start(tmp_path: Path, limits: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="limits"):
        _read(tmp_path, {**BEFORE_LIMITS, "limits": limits})


def test_each_source_and_the_whole_have_their_cap() -> None:
    occupancy = Occupancy(per_source=2, total=3)
    assert occupancy.enter("a") is None
    assert occupancy.enter("a") is None
    assert occupancy.enter("a") is Full.SOURCE
    assert occupancy.enter("b") is None
    assert occupancy.enter("c") is Full.TOTAL
    occupancy.leave("a")
    assert occupancy.enter("c") is None
    assert len(occupancy) == 3


def test_an_ipv6_client_counts_by_its_64_and_a_mapped_one_as_ipv4() -> None:
    assert source_of("2001:db8:1:2:aaaa::1") == source_of("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert source_of("2001:db8:1:3::1") != source_of("2001:db8:1:2::1")
    assert source_of("::ffff:192.0.2.7") == source_of("192.0.2.7") == "192.0.2.7"


@pytest.mark.parametrize(("soft", "hard", "fits"), [(200, 200, 68), (100, 4096, 1024), (100, 1000, 468)])
def test_the_total_fits_the_descriptor_limit(soft: int, hard: int, fits: int) -> None:
    script = (
        "import resource\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))\n"
        "from stacks.forward_proxy.occupancy import fit_descriptors\n"
        "print(fit_descriptors(1024), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    total, raised = map(int, out.split())
    assert total == fits
    assert raised >= min(hard, 2 * 1024 + 64)  # the soft limit went up as far as needed and allowed


def test_a_login_says_who_logged_in() -> None:
    config = ProxyConfig(
        bind="127.0.0.1", port=1, protocol="http", egress=EgressSpec(), username="s", password="p"
    )
    users = LeaseUsers()
    users.add("lease-1", "pw", ttl=60)
    gate = Gate(config=config, users=users)
    assert gate.login(b"s", b"p") is Login.STATIC
    assert gate.login(b"lease-1", b"pw") is Login.LEASE
    assert gate.login(b"lease-1", b"p") is Login.REFUSED
    open_gate = Gate(
        config=ProxyConfig(bind="127.0.0.1", port=1, protocol="http", egress=EgressSpec()), users=users
    )
    assert open_gate.login(b"", b"") is Login.OPEN


class _Conn:
    def __init__(self) -> None:
        self.cuts = 0

    def cut(self) -> None:
        self.cuts += 1


def test_tethers_cut_at_the_revoke_and_at_the_end_and_a_renewal_moves_the_end(
    current_event_loop: asyncio.AbstractEventLoop,  # this folder's one loop (conftest): not asyncio.run
) -> None:
    async def scenario() -> None:
        users = LeaseUsers()
        tethers = Tethers(users)
        for name in ("revoked", "ending", "renewed"):
            users.add(name, "pw", ttl=0.3)
        revoked, ending, renewed, second = _Conn(), _Conn(), _Conn(), _Conn()
        tethers.attach(b"revoked", revoked)
        tethers.attach(b"ending", ending)
        tethers.attach(b"renewed", renewed)
        tethers.attach(b"renewed", second)
        tethers.detach(b"renewed", second)  # closed on its own: never cut
        users.revoke("revoked")
        assert revoked.cuts == 1  # at once, no timer
        users.renew("renewed", ttl=60)
        await asyncio.sleep(0.5)
        assert (ending.cuts, renewed.cuts, second.cuts) == (1, 0, 0)
        assert len(tethers) == 1  # only the renewed user still has a connection (and a timer)
        tethers.detach(b"renewed", renewed)
        assert len(tethers) == 0

    current_event_loop.run_until_complete(scenario())
