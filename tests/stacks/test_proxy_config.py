"""The proxy daemon configuration that the gcp and kvm programs put on their VMs."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from stacks.programs.component import Credentials, InvalidInputError
from stacks.programs.proxy_config import (
    SETUP_PATH,
    ProxySettings,
    check_credentials,
    cloud_init_user_data,
    danted_conf,
    setup_script,
    tinyproxy_conf,
)

CREDS = Credentials(username="crawler", password="Pa55word.x_y-z")
RANGES = ("203.0.113.0/24", "198.51.100.7/32", "2001:db8::/32")


def _settings(**overrides: object) -> ProxySettings:
    values: dict[str, object] = {
        "port": 8888,
        "protocol": "http",
        "allowed_source_ranges": RANGES,
        "credentials": CREDS,
    }
    return ProxySettings(**{**values, **overrides})  # type: ignore[arg-type]


def test_tinyproxy_conf_has_port_basic_auth_and_one_allow_per_range() -> None:
    lines = tinyproxy_conf(_settings()).splitlines()

    assert "Port 8888" in lines
    assert "Listen 0.0.0.0" in lines
    assert "BasicAuth crawler Pa55word.x_y-z" in lines
    assert [line for line in lines if line.startswith("Allow ")] == [f"Allow {cidr}" for cidr in RANGES]


def test_tinyproxy_conf_without_credentials_or_ranges() -> None:
    lines = tinyproxy_conf(_settings(credentials=None, allowed_source_ranges=("10.0.0.0/8",))).splitlines()

    assert not [line for line in lines if line.startswith("BasicAuth")]
    assert [line for line in lines if line.startswith("Allow")] == ["Allow 10.0.0.0/8"]


def test_danted_conf_passes_each_range_and_asks_for_a_proxy_level_username() -> None:
    conf = danted_conf(_settings(protocol="socks5", port=1080))

    assert "internal: 0.0.0.0 port = 1080" in conf
    assert "socksmethod: pam.username" in conf
    assert "user.unprivileged: proxy-egress" in conf
    for cidr in RANGES:
        assert f"client pass {{ from: {cidr} to: 0/0 }}" in conf
        assert f"socks pass {{ from: {cidr} to: 0/0 port = 443 }}" in conf


@pytest.mark.parametrize("protocol", ["http", "socks5"])
def test_setup_script_is_valid_bash(protocol: str) -> None:
    bash = shutil.which("bash")
    assert bash, "bash is needed to check the script"
    script = setup_script(_settings(protocol=protocol))
    checked = subprocess.run([bash, "-n"], input=script, text=True, capture_output=True, check=False)

    assert checked.returncode == 0, checked.stderr
    assert script.startswith("#!/bin/bash\n")
    assert "set -euo pipefail" in script


def test_setup_script_writes_the_rendered_config_verbatim() -> None:
    settings = _settings()
    script = setup_script(settings)

    assert tinyproxy_conf(settings) in script
    assert "systemctl restart tinyproxy" in script


def test_cloud_init_runs_the_setup_script_once() -> None:
    settings = _settings()
    user_data = cloud_init_user_data(settings, hostname="px-crawl-a")
    document = yaml.safe_load(user_data)

    assert user_data.startswith("#cloud-config\n")
    assert document["hostname"] == "px-crawl-a"
    assert document["write_files"] == [
        {"path": SETUP_PATH, "permissions": "0700", "owner": "root:root", "content": setup_script(settings)}
    ]
    assert document["runcmd"] == [[SETUP_PATH]]
    assert "content: |" in user_data  # readable on the VM, not one escaped line


@pytest.mark.parametrize("bad", ["with space", "quote'", "colon:x", "new\nline", "trailing\n", "", "x" * 129])
def test_credentials_that_a_config_file_cannot_carry_are_refused(bad: str) -> None:
    with pytest.raises(InvalidInputError, match=r"crawl/a auth\.secretRef: the password may hold only"):
        check_credentials(Credentials(username="ok", password=bad), where="crawl/a auth.secretRef")
