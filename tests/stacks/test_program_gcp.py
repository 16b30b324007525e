"""The gcp program's inputs to Compute Engine and Secret Manager, asserted on a recording mock.

These tests mock with `pulumi.runtime.set_mocks` because the gcp provider plugin cannot be downloaded or run
here; each test installs fresh mocks and runs the program under `pulumi.runtime.test`.
"""

from __future__ import annotations

import re
from typing import Any

import pulumi
import pytest
from pulumi.runtime import rpc

from stacks.models import GcpProvider
from stacks.programs.context import ProgramSettings
from tests.stacks.program_harness import GENERATED, RecordingMocks, install, proxy, run

# pulumi_gcp.compute warns about its own deprecated aliases when imported.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pulumi_gcp")

INSTANCE = "gcp:compute/instance:Instance"
FIREWALL = "gcp:compute/firewall:Firewall"
ADDRESS = "gcp:compute/address:Address"
ACCOUNT = "gcp:serviceaccount/account:Account"
SECRET = "gcp:secretmanager/secret:Secret"
VERSION = "gcp:secretmanager/secretVersion:SecretVersion"
GRANT = "gcp:secretmanager/secretIamMember:SecretIamMember"
EPHEMERAL_IP = "203.0.113.50"
STATIC_IP = "198.51.100.7"
GCP_LABEL_VALUE = re.compile(r"^[-_a-z0-9]{0,63}$")
ENTRY = GcpProvider(
    name="gcp-eu", type="gcp", project="crawl-proj", region="europe-west1", zone="europe-west1-b"
)


def _nat_ip(outputs: dict[str, Any]) -> dict[str, Any]:
    nics = outputs["networkInterfaces"]
    access = nics[0]["accessConfigs"][0]
    access["natIp"] = access.get("natIp") or EPHEMERAL_IP
    return {"networkInterfaces": nics}


@pytest.fixture
def mocks() -> RecordingMocks:
    recording = RecordingMocks(
        computed={
            INSTANCE: _nat_ip,
            ADDRESS: lambda _: {"address": STATIC_IP},
            ACCOUNT: lambda o: {"email": f"{o['accountId']}@crawl-proj.iam.gserviceaccount.com"},
            VERSION: lambda _: {"name": "projects/123/secrets/px-crawl-alpha/versions/1"},
        }
    )
    install(recording, stack="gcp-eu")
    return recording


def _settings(credentials: str | None = '{"type": "service_account"}') -> ProgramSettings:
    secret = pulumi.Output.secret(credentials) if credentials else None
    return ProgramSettings(stack="gcp-eu", root_dir="/tmp", provider_credentials=secret)


def _is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(rpc._special_sig_key) == rpc._special_secret_sig


def test_firewall_admits_exactly_the_port_from_the_ranges_to_the_instance_tag(mocks: RecordingMocks) -> None:
    ranges = ["203.0.113.0/24", "198.51.100.0/24", "2001:db8::/32"]
    run(
        entry=ENTRY,
        proxies=[proxy("alpha", provider="gcp-eu", port=8888, allowedSourceRanges=ranges)],
        settings=_settings(),
    )
    rules = {r.inputs["name"]: r.inputs for r in mocks.of_type(FIREWALL)}
    instance = mocks.one(INSTANCE).inputs

    # GCP refuses mixed IP families in one rule: one rule per family, each for exactly tcp:8888.
    assert rules["px-crawl-alpha-v4"]["sourceRanges"] == ["203.0.113.0/24", "198.51.100.0/24"]
    assert rules["px-crawl-alpha-v6"]["sourceRanges"] == ["2001:db8::/32"]
    for rule in rules.values():
        assert rule["allows"] == [{"protocol": "tcp", "ports": ["8888"]}]
        assert rule["direction"] == "INGRESS"
        assert rule["targetTags"] == instance["tags"] == ["px-crawl-alpha"]


def test_startup_script_installs_tinyproxy_with_credentials_and_ranges(mocks: RecordingMocks) -> None:
    outputs = run(
        entry=ENTRY,
        proxies=[proxy("alpha", provider="gcp-eu", port=8888, allowedSourceRanges=["203.0.113.0/24"])],
        settings=_settings(),
    )
    script = mocks.one(INSTANCE).inputs["metadataStartupScript"]

    assert "apt-get install -y -q tinyproxy" in script
    assert "Port 8888" in script
    # The credentials come from Secret Manager at boot, never from the metadata.
    assert "BasicAuth @PROXY_USERNAME@ @PROXY_PASSWORD@" in script
    assert "secretmanager.googleapis.com/v1/projects/123/secrets/px-crawl-alpha/versions/1:access" in script
    assert "s/@PROXY_USERNAME@/${PROXY_USERNAME}/;s/@PROXY_PASSWORD@/${PROXY_PASSWORD}/" in script
    assert GENERATED["password"] not in script
    assert "Allow 203.0.113.0/24" in script
    assert outputs["credentials"]["crawl/alpha"] == GENERATED


def test_secret_mode_credentials_reach_the_script_as_a_secret(mocks: RecordingMocks) -> None:
    spec = {"provider": "gcp-eu", "auth": {"mode": "secret", "secretRef": {"name": "beta-auth"}}}
    given = {"crawl/beta": {"username": "crawler", "password": "from-the-secret"}}
    run(entry=ENTRY, proxies=[proxy("beta", **spec)], settings=_settings(), credentials=given)
    script = mocks.one(INSTANCE).inputs["metadataStartupScript"]

    assert "from-the-secret" not in str(script)
    version = mocks.one(VERSION).inputs
    assert _is_secret(version["secretData"])
    assert version["secretData"]["value"] == "crawler:from-the-secret"
    assert mocks.of_type("pulumi-python:dynamic/proxy-operator:GeneratedCredentials") == []


def test_socks5_runs_dante_with_a_proxy_level_user(mocks: RecordingMocks) -> None:
    run(
        entry=ENTRY,
        proxies=[proxy("alpha", provider="gcp-eu", protocol="socks5", port=1080)],
        settings=_settings(),
    )
    script = mocks.one(INSTANCE).inputs["metadataStartupScript"]

    assert "apt-get install -y -q dante-server" in script
    assert "chpasswd" not in script
    assert 'HASH=$(openssl passwd -6 "${PROXY_PASSWORD}")' in script
    assert 'echo "${PROXY_USERNAME}:$HASH"' in script
    assert GENERATED["password"] not in script
    assert "internal: 0.0.0.0 port = 1080" in script
    assert "socksmethod: pam.username" in script


def test_labels_name_the_service_the_proxy_and_the_stack(mocks: RecordingMocks) -> None:
    long_name = "a-very-long-proxy-name-" + "x" * 60
    spec = {"provider": "gcp-eu", "gcp": {"addressType": "static"}}
    run(entry=ENTRY, proxies=[proxy(long_name, namespace="crawl.team", **spec)], settings=_settings())
    instance = mocks.one(INSTANCE).inputs
    labelled = [
        instance["labels"],
        instance["bootDisk"]["initializeParams"]["labels"],
        mocks.one(ADDRESS).inputs["labels"],
    ]

    for labels in labelled:
        assert labels["managed-by"] == "proxy-operator"
        assert labels["stack"] == "gcp-eu"
        assert labels["proxy"].startswith("crawl_team_a-very-long-proxy-name-")
        assert all(GCP_LABEL_VALUE.match(value) for value in labels.values())
    assert len(instance["name"]) <= 63


def test_static_address_is_the_nat_ip_and_the_published_host(mocks: RecordingMocks) -> None:
    spec = {"provider": "gcp-eu", "port": 3128, "gcp": {"addressType": "static", "zone": "europe-west1-c"}}
    outputs = run(entry=ENTRY, proxies=[proxy("alpha", **spec)], settings=_settings())
    instance = mocks.one(INSTANCE).inputs

    assert mocks.one(ADDRESS).inputs["region"] == "europe-west1"
    assert instance["zone"] == "europe-west1-c"
    assert instance["networkInterfaces"][0]["accessConfigs"][0]["natIp"] == STATIC_IP
    assert outputs["proxies"]["crawl/alpha"] == {
        "host": STATIC_IP,
        "port": 3128,
        "protocol": "http",
        "instanceId": "crawl/alpha-id",
    }


def test_ephemeral_address_publishes_the_instance_nat_ip(mocks: RecordingMocks) -> None:
    outputs = run(entry=ENTRY, proxies=[proxy("alpha", provider="gcp-eu")], settings=_settings())

    assert mocks.of_type(ADDRESS) == []
    assert outputs["proxies"]["crawl/alpha"]["host"] == EPHEMERAL_IP


def test_preemptible_scheduling_and_machine_settings(mocks: RecordingMocks) -> None:
    spec = {
        "provider": "gcp-eu",
        "gcp": {"preemptible": True, "machineType": "e2-small", "image": "debian-cloud/debian-12"},
    }
    run(entry=ENTRY, proxies=[proxy("alpha", **spec)], settings=_settings())
    instance = mocks.one(INSTANCE).inputs

    assert instance["scheduling"] == {
        "preemptible": True,
        "automaticRestart": False,
        "onHostMaintenance": "TERMINATE",
    }
    assert instance["machineType"] == "e2-small"
    assert instance["bootDisk"]["initializeParams"]["image"] == "debian-cloud/debian-12"


def test_provider_takes_the_catalogue_project_and_secret_credentials(mocks: RecordingMocks) -> None:
    run(entry=ENTRY, proxies=[proxy("alpha", provider="gcp-eu")], settings=_settings())
    [gcp_provider] = [r for r in mocks.resources if r.typ == "pulumi:providers:gcp"]

    assert gcp_provider.inputs["project"] == "crawl-proj"
    assert _is_secret(gcp_provider.inputs["credentials"])
    assert all(
        r.provider and "gcp-gcp-eu" in r.provider for r in mocks.of_type(INSTANCE) + mocks.of_type(FIREWALL)
    )


def test_only_the_proxys_own_account_may_read_its_secret_and_the_vm_runs_as_it(mocks: RecordingMocks) -> None:
    run(entry=ENTRY, proxies=[proxy("alpha", provider="gcp-eu")], settings=_settings())
    account, grant = mocks.one(ACCOUNT).inputs, mocks.one(GRANT).inputs
    instance = mocks.one(INSTANCE).inputs
    email = f"{account['accountId']}@crawl-proj.iam.gserviceaccount.com"

    assert grant["secretId"] == "crawl/alpha-id"  # this proxy's secret, not the project
    assert grant["role"] == "roles/secretmanager.secretAccessor"
    assert grant["member"] == f"serviceAccount:{email}"
    assert instance["serviceAccount"]["email"] == email
    assert mocks.one(SECRET).inputs["secretId"] == instance["name"]
    # The password is in the secret version only: no metadata or other input of any resource holds it.
    for resource in mocks.resources:
        if resource.typ != VERSION:
            assert GENERATED["password"] not in str(resource.inputs), resource.typ
