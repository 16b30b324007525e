"""Metadata and private destinations refused for real, inside a network namespace this test creates.

`netns_probe` runs under `unshare --net`: its loopback holds test-owned hosts on 169.254.169.254 and
10.20.30.40, so nothing is ever sent to the host's network. There, the `local` forward proxy refuses both
(metadata even when 169.254.0.0/16 is allowed explicitly), and the nftables rules that the gcp and kvm
setup scripts load refuse the proxy daemon's user while root still connects. Fails on the code before
issue 11 (pproxy forwarded to both; the VMs had no egress rules).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def _namespaces_fail() -> str | None:
    """Why a network namespace cannot be made here, None when it can. A missing tool is a broken install
    (`make test-deps` installs nftables, iproute2, util-linux): the tests fail, they never skip."""
    missing = [tool for tool in ("unshare", "ip", "nft", "setpriv") if not shutil.which(tool)]
    if missing:
        return f"missing {', '.join(missing)}: run `make test-deps` (scripts/install-system-deps.sh test)"
    done = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"`unshare --net` refused ({done.stderr.strip()}): these tests need root"
    return None


@pytest.fixture(scope="module")
def outcomes() -> dict[str, object]:
    why = _namespaces_fail()
    if why is not None:
        pytest.fail(why, pytrace=False)
    command = ["unshare", "--net", sys.executable, "-m", "tests.security.netns_probe"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_local_proxy_refuses_the_metadata_server_even_when_its_range_is_allowed(outcomes: dict) -> None:
    for case in ("proxy_metadata_default", "proxy_metadata_wide"):
        status, proxy_status = outcomes[case]
        assert status == 403, case
        assert "error=destination_ip_prohibited" in proxy_status


def test_the_local_proxy_refuses_a_private_host_unless_allowed(outcomes: dict) -> None:
    assert outcomes["proxy_private_default"][0] == 403
    assert outcomes["proxy_private_allowed"][0] == 200


def test_the_vm_nftables_rules_refuse_the_proxy_user_and_spare_root(outcomes: dict) -> None:
    assert outcomes["nobody_before_rules"] is True  # the site answers: a refusal below is the rules'
    assert outcomes["nobody_metadata"] is False
    assert outcomes["nobody_private"] is False
    assert outcomes["root_metadata"] is True


def test_the_vm_nftables_rules_honour_explicit_allows_but_never_metadata(outcomes: dict) -> None:
    assert outcomes["nobody_private_allowed"] is True
    assert outcomes["nobody_metadata_wide"] is False
