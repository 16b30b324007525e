"""The kvm program's inputs to libvirt, asserted on a recording mock.

These tests mock with `pulumi.runtime.set_mocks` because the libvirt provider plugin cannot be downloaded or
run here (nor is there a KVM host); each test installs fresh mocks and runs the program under
`pulumi.runtime.test`.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from pulumi.runtime import rpc

from stacks.models import KvmProvider
from stacks.programs.component import InvalidInputError
from stacks.programs.context import ProgramSettings
from stacks.programs.kvm_credentials import CREDENTIALS_PATH, RECEIVER_PATH
from stacks.programs.proxy_config import SETUP_PATH
from tests.stacks.program_harness import GENERATED, RecordingMocks, install, proxy, run

VOLUME = "libvirt:index/volume:Volume"
DOMAIN = "libvirt:index/domain:Domain"
CLOUD_INIT = "libvirt:index/cloudInitDisk:CloudInitDisk"
SUFFIX = "pulumi-python:dynamic/proxy-operator:StableSuffix"
GUEST_CREDENTIALS = "pulumi-python:dynamic/proxy-operator:GuestCredentials"
LEASE = "192.168.122.50"
SSH_DIR = "/etc/proxy-operator/kvm"
ENTRY = KvmProvider.model_validate(
    {
        "name": "kvm-home",
        "type": "kvm",
        "pool": "default",
        "hosts": [
            {"name": "hv1", "uri": "qemu+ssh://virt@hv1.lan:2222/system"},
            {
                "name": "hv2",
                "uri": "qemu+ssh://virt@10.0.0.12/system?socket=/run/libvirt/libvirt-sock",
                "pool": "fast",
            },
        ],
    }
)


def _lease(outputs: dict[str, Any]) -> dict[str, Any]:
    nics = outputs["networkInterfaces"]
    nics[0]["addresses"] = [LEASE]
    return {"networkInterfaces": nics}


@pytest.fixture
def mocks() -> RecordingMocks:
    recording = RecordingMocks(computed={DOMAIN: _lease, SUFFIX: lambda _: {"suffix": "k3x9q2"}})
    install(recording, stack="kvm-home")
    return recording


SETTINGS = ProgramSettings(stack="kvm-home", root_dir="/tmp", kvm_ssh_dir=SSH_DIR)


def _providers(mocks: RecordingMocks) -> dict[str, str]:
    return {r.name: r.inputs["uri"] for r in mocks.resources if r.typ == "pulumi:providers:libvirt"}


def test_one_provider_per_host_in_use_with_key_and_known_hosts(mocks: RecordingMocks) -> None:
    proxies = [proxy("a", provider="kvm-home"), proxy("b", provider="kvm-home", kvm={"host": "hv2"})]
    proxies.append(proxy("c", provider="kvm-home", kvm={"host": "hv2"}))
    run(entry=ENTRY, proxies=proxies, settings=SETTINGS)
    uris = _providers(mocks)

    assert sorted(uris) == ["kvm-kvm-home-hv1", "kvm-kvm-home-hv2"]
    hv1 = urlsplit(uris["kvm-kvm-home-hv1"])
    assert (hv1.scheme, hv1.username, hv1.hostname, hv1.port, hv1.path) == (
        "qemu+ssh",
        "virt",
        "hv1.lan",
        2222,
        "/system",
    )
    query = parse_qs(hv1.query)
    assert query["keyfile"] == [f"{SSH_DIR}/id_ed25519"]
    # terraform-provider-libvirt (bundled by pulumi-libvirt 0.5) reads `knownhosts`, not `known_hosts`.
    assert query["knownhosts"] == [f"{SSH_DIR}/known_hosts"]
    assert query["known_hosts_verify"] == ["normal"]
    # The catalogue's own parameters survive.
    assert parse_qs(urlsplit(uris["kvm-kvm-home-hv2"]).query)["socket"] == ["/run/libvirt/libvirt-sock"]


def test_proxy_volume_is_cloned_from_the_cached_base_image(mocks: RecordingMocks) -> None:
    run(entry=ENTRY, proxies=[proxy("a", provider="kvm-home", kvm={"diskGib": 20})], settings=SETTINGS)
    volumes = {r.name: r for r in mocks.of_type(VOLUME)}
    base = volumes["base-hv1-default-debian-12-generic-amd64.qcow2"]
    clone = volumes["crawl/a"]

    assert base.inputs["name"] == "debian-12-generic-amd64-k3x9q2.qcow2"
    assert base.inputs["source"] == ENTRY.base_image
    assert clone.inputs["baseVolumeId"] == f"{base.name}-id"  # the mock's id of the base volume
    assert clone.inputs["size"] == 20 * 1024**3
    assert clone.inputs["pool"] == base.inputs["pool"] == "default"


def test_one_base_volume_per_host_and_pool(mocks: RecordingMocks) -> None:
    proxies = [proxy(name, provider="kvm-home", kvm={"host": "hv2"}) for name in ("a", "b", "c")]
    run(entry=ENTRY, proxies=proxies, settings=SETTINGS)
    bases = [r for r in mocks.of_type(VOLUME) if r.name.startswith("base-")]

    assert [(b.name, b.inputs["pool"]) for b in bases] == [
        ("base-hv2-fast-debian-12-generic-amd64.qcow2", "fast")
    ]
    assert {r.inputs["baseVolumeId"] for r in mocks.of_type(VOLUME) if r.name.startswith("crawl/")} == {
        f"{bases[0].name}-id"
    }


def test_cloud_init_installs_tinyproxy_and_waits_for_the_credentials(mocks: RecordingMocks) -> None:
    spec = {"provider": "kvm-home", "port": 8080, "allowedSourceRanges": ["192.168.1.0/24"]}
    run(entry=ENTRY, proxies=[proxy("a", **spec)], settings=SETTINGS)
    disk = mocks.one(CLOUD_INIT).inputs
    user_data = disk["userData"]

    assert user_data.startswith("#cloud-config\n")
    document = yaml.safe_load(user_data)
    files = {f["path"]: f for f in document["write_files"]}
    assert {f["permissions"] for f in files.values()} == {"0700"}
    setup = files[SETUP_PATH]["content"]
    assert "Port 8080" in setup
    assert "BasicAuth @PROXY_USERNAME@ @PROXY_PASSWORD@" in setup
    assert f"CREDS=$(cat {CREDENTIALS_PATH})" in setup
    assert "Allow 192.168.1.0/24" in setup
    # The setup runs when the receiver gets the credentials through the guest agent, not from runcmd.
    assert files[RECEIVER_PATH]["content"].endswith(f"exec {SETUP_PATH}\n")
    assert document["packages"] == ["qemu-guest-agent"]
    assert document["runcmd"] == [["systemctl", "start", "qemu-guest-agent"]]
    assert disk["metaData"].startswith("instance-id: px-crawl-a-")


def test_without_credentials_the_setup_runs_from_cloud_init(mocks: RecordingMocks) -> None:
    spec = {"provider": "kvm-home", "auth": {"mode": "none"}, "allowedSourceRanges": ["192.168.1.0/24"]}
    run(entry=ENTRY, proxies=[proxy("open", **spec)], settings=SETTINGS)
    document = yaml.safe_load(mocks.one(CLOUD_INIT).inputs["userData"])

    assert [f["path"] for f in document["write_files"]] == [SETUP_PATH]
    assert document["runcmd"] == [[SETUP_PATH]]
    assert mocks.of_type(GUEST_CREDENTIALS) == []


def _cloud_init_for(port: int) -> dict[str, Any]:
    mocks = RecordingMocks(computed={DOMAIN: _lease})
    install(mocks, stack="kvm-home")
    run(entry=ENTRY, proxies=[proxy("a", provider="kvm-home", port=port)], settings=SETTINGS)
    return mocks.one(CLOUD_INIT).inputs


def test_a_new_configuration_is_a_new_cloud_init_instance_and_iso() -> None:
    first, same, changed = _cloud_init_for(3128), _cloud_init_for(3128), _cloud_init_for(3129)

    # cloud-init runs the setup once per instance-id: a new config needs a new id to be applied on boot.
    assert first["metaData"] == same["metaData"]
    assert first["metaData"] != changed["metaData"]
    assert first["name"] != changed["name"]
    assert first["name"].endswith("-cloudinit.iso")


def test_domain_uses_the_disks_and_waits_for_a_lease_which_is_published(mocks: RecordingMocks) -> None:
    spec = {"provider": "kvm-home", "port": 3128, "kvm": {"vcpus": 2, "memoryMib": 1024}}
    outputs = run(entry=ENTRY, proxies=[proxy("a", **spec)], settings=SETTINGS)
    domain = mocks.one(DOMAIN).inputs

    assert (domain["vcpu"], domain["memory"]) == (2, 1024)
    assert domain["disks"] == [{"volumeId": "crawl/a-id"}]
    assert domain["cloudinit"] == "crawl/a-id"
    assert domain["networkInterfaces"][0]["networkName"] == "default"
    assert domain["networkInterfaces"][0]["waitForLease"] is True
    assert domain["description"] == "managed-by=proxy-operator proxy=crawl/a stack=kvm-home"
    assert outputs["proxies"]["crawl/a"] == {
        "host": LEASE,
        "port": 3128,
        "protocol": "http",
        "instanceId": "crawl/a-id",
    }


def test_a_host_missing_from_the_catalogue_is_a_permanent_error(mocks: RecordingMocks) -> None:
    with pytest.raises(
        InvalidInputError, match="'hv9' is not a host of provider 'kvm-home' \\(it has: hv1, hv2\\)"
    ):
        run(entry=ENTRY, proxies=[proxy("a", provider="kvm-home", kvm={"host": "hv9"})], settings=SETTINGS)
    assert mocks.of_type(DOMAIN) == []


def _is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(rpc._special_sig_key) == rpc._special_secret_sig


@pytest.mark.parametrize(
    ("spec", "given", "password"),
    [
        ({}, None, GENERATED["password"]),
        (
            {"auth": {"mode": "secret", "secretRef": {"name": "a-auth"}}},
            {"crawl/a": {"username": "crawler", "password": "from-the-secret"}},
            "from-the-secret",
        ),
    ],
    ids=["generated", "secret"],
)
def test_the_password_is_in_no_libvirt_input_only_in_the_guest_delivery(
    mocks: RecordingMocks, spec: dict[str, Any], given: dict[str, Any] | None, password: str
) -> None:
    """Issue 11: the cloud-init disk (user-data, meta-data) lies in the host's pool and the domain XML is
    readable by every libvirt user; the credentials go to the guest over SSH instead."""
    run(entry=ENTRY, proxies=[proxy("a", provider="kvm-home", **spec)], settings=SETTINGS, credentials=given)
    libvirt_inputs = [r.inputs for r in mocks.resources if "libvirt" in r.typ]

    assert {r.typ for r in mocks.resources if "libvirt" in r.typ} >= {VOLUME, DOMAIN, CLOUD_INIT}
    assert password not in json.dumps(libvirt_inputs)
    delivery = mocks.one(GUEST_CREDENTIALS).inputs
    assert _is_secret(delivery["password"])
    assert delivery["password"]["value"] == password
    assert _is_secret(delivery["username"])
    assert (delivery["sshTarget"], delivery["sshPort"], delivery["libvirtUri"]) == (
        "virt@hv1.lan",
        2222,
        "qemu:///system",
    )
    assert (delivery["sshDir"], delivery["domain"], delivery["domainId"]) == (
        SSH_DIR,
        "px-crawl-a",
        "crawl/a-id",
    )


def test_a_rotation_keeps_the_cloud_init_disk_and_so_the_domain() -> None:
    """New credentials are delivered to the running guest: the user-data (and the domain) do not change."""
    disks = []
    for password in ("first-password", "second-password"):
        recording = RecordingMocks(computed={DOMAIN: _lease})
        install(recording, stack="kvm-home")
        given = {"crawl/a": {"username": "crawler", "password": password}}
        spec = {"provider": "kvm-home", "auth": {"mode": "secret", "secretRef": {"name": "a-auth"}}}
        run(entry=ENTRY, proxies=[proxy("a", **spec)], settings=SETTINGS, credentials=given)
        disks.append(recording.one(CLOUD_INIT).inputs)
        assert recording.one(GUEST_CREDENTIALS).inputs["password"]["value"] == password

    assert disks[0] == disks[1]
