"""The gcp and kvm setup script enforces spec.egress inside the VM and keeps SOCKS users proxy-level.

(The rules themselves are loaded for real in a network namespace by test_netns_egress.py.) Fails on the
code before issue 11: the script had no egress rules and made every SOCKS user a system account.
"""

from __future__ import annotations

import pytest

from stacks.models import EgressSpec
from stacks.programs.component import Credentials
from stacks.programs.proxy_config import ProxySettings, setup_script

CREDS = Credentials(username="crawler", password="Pa55word")


def _script(protocol: str, **egress: object) -> str:
    settings = ProxySettings(
        port=3128,
        protocol=protocol,
        allowed_source_ranges=("203.0.113.0/24",),
        credentials=CREDS,
        egress=EgressSpec.model_validate(egress),
    )
    return setup_script(settings)


@pytest.mark.parametrize(
    ("protocol", "user", "daemon"), [("http", "tinyproxy", "tinyproxy"), ("socks5", "proxy-egress", "danted")]
)
def test_the_rules_bind_the_daemons_user_and_load_before_it_serves(
    protocol: str, user: str, daemon: str
) -> None:
    script = _script(protocol)
    assert f'meta skuid != "{user}" accept' in script
    assert "ip daddr 169.254.169.254 reject" in script
    assert "tcp dport { 80, 443 } accept" in script
    assert script.index("nft -f /etc/proxy-operator-egress.nft") < script.index(f"systemctl restart {daemon}")
    assert 'include "/etc/proxy-operator-egress.nft"' in script  # loaded again at every boot


def test_explicit_allows_reach_the_vm_rules_and_tinyproxys_connect_ports() -> None:
    script = _script("http", allow=[{"cidr": "10.1.0.0/16", "ports": [5432]}], allowPorts=[443])
    assert "ip daddr 10.1.0.0/16 tcp dport { 5432 } accept" in script
    assert "tcp dport { 443 } accept" in script
    assert [line for line in script.splitlines() if line.startswith("ConnectPort")] == [
        "ConnectPort 443",
        "ConnectPort 5432",
    ]


def test_socks_users_are_proxy_level_not_system_accounts() -> None:
    script = _script("socks5")
    assert "chpasswd" not in script
    assert "useradd --system --no-create-home --shell /usr/sbin/nologin crawler" not in script
    assert "pam_pwdfile.so pwdfile=/etc/proxy-operator/socks.passwd" in script
    assert "socksmethod: pam.username" in script
