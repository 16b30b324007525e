"""The kvm program's wiring of its libvirt resources (dynamic providers on libvirt-python), asserted on a
recording mock: which resources per host and proxy, and the inputs each gets.

Mocked with `pulumi.runtime.set_mocks` (each test installs fresh mocks and runs the program under
`pulumi.runtime.test`) so that many shapes of catalogue run in a second; the providers themselves run
against libvirt in tests/stacks/test_libvirt_providers.py, and the whole program with the real engine against
the test KVM host in tests/kvm/test_program_kvm_engine.py.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from pulumi.runtime import rpc

from stacks.models import KvmProvider
from stacks.programs.component import InvalidInputError
from stacks.programs.context import ProgramSettings
from stacks.programs.kvm_credentials import CREDENTIALS_PATH, RECEIVER_PATH
from stacks.programs.proxy_config import SETUP_PATH
from tests.stacks.program_harness import GENERATED, RecordingMocks, install, proxy, run

DYNAMIC = "pulumi-python:dynamic/proxy-operator:"
BASE = f"{DYNAMIC}LibvirtBaseVolume"
VOLUME = f"{DYNAMIC}LibvirtVolume"
DOMAIN = f"{DYNAMIC}LibvirtDomain"
CLOUD_INIT = f"{DYNAMIC}LibvirtCloudInitDisk"
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


@pytest.fixture(autouse=True)
def own_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ssh wrapper (libvirt_conn.py, under the temporary directory) goes into the test's own folder."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)


def _lease(outputs: dict[str, Any]) -> dict[str, Any]:
    return {"address": LEASE, "uuid": "the-uuid"}


def _path(outputs: dict[str, Any]) -> dict[str, Any]:
    return {"path": f"/pool/{outputs['name']}"}


COMPUTED = {DOMAIN: _lease, BASE: _path, VOLUME: _path, CLOUD_INIT: _path}


@pytest.fixture
def mocks() -> RecordingMocks:
    recording = RecordingMocks(computed={**COMPUTED, SUFFIX: lambda _: {"suffix": "k3x9q2"}})
    install(recording, stack="kvm-home")
    return recording


SETTINGS = ProgramSettings(stack="kvm-home", root_dir="/tmp", kvm_ssh_dir=SSH_DIR)


def test_every_libvirt_resource_names_its_host_uri_and_the_mounted_ssh_folder(mocks: RecordingMocks) -> None:
    """The catalogue URI as written (the providers dial it over qemu+libssh, `libvirt_conn`), per host."""
    proxies = [proxy("a", provider="kvm-home"), proxy("b", provider="kvm-home", kvm={"host": "hv2"})]
    run(entry=ENTRY, proxies=proxies, settings=SETTINGS)
    libvirt = [r for r in mocks.resources if r.typ in (BASE, VOLUME, DOMAIN, CLOUD_INIT)]

    assert len(libvirt) == 2 * 4  # per host: one base volume; per proxy: a volume, a disk, a domain
    assert {r.inputs["sshDir"] for r in libvirt} == {SSH_DIR}
    by_proxy = {r.inputs["uri"] for r in libvirt if r.name == "crawl/b"}
    assert by_proxy == {"qemu+ssh://virt@10.0.0.12/system?socket=/run/libvirt/libvirt-sock"}
    assert {r.inputs["uri"] for r in libvirt if r.name == "crawl/a"} == {
        "qemu+ssh://virt@hv1.lan:2222/system"
    }


def test_proxy_volume_is_cloned_from_the_cached_base_image(mocks: RecordingMocks) -> None:
    run(entry=ENTRY, proxies=[proxy("a", provider="kvm-home", kvm={"diskGib": 20})], settings=SETTINGS)
    base = mocks.one(BASE)
    clone = mocks.one(VOLUME)

    assert base.name == "base-hv1-default-debian-12-generic-amd64.qcow2"
    assert base.inputs["name"] == "debian-12-generic-amd64-k3x9q2.qcow2"
    assert base.inputs["source"] == ENTRY.base_image
    assert clone.name == "crawl/a"
    assert clone.inputs["basePath"] == "/pool/debian-12-generic-amd64-k3x9q2.qcow2"  # the base's path output
    assert clone.inputs["sizeBytes"] == 20 * 1024**3
    assert clone.inputs["pool"] == base.inputs["pool"] == "default"


def test_one_base_volume_per_host_and_pool(mocks: RecordingMocks) -> None:
    proxies = [proxy(name, provider="kvm-home", kvm={"host": "hv2"}) for name in ("a", "b", "c")]
    run(entry=ENTRY, proxies=proxies, settings=SETTINGS)
    bases = mocks.of_type(BASE)

    assert [(b.name, b.inputs["pool"]) for b in bases] == [
        ("base-hv2-fast-debian-12-generic-amd64.qcow2", "fast")
    ]
    assert {r.inputs["basePath"] for r in mocks.of_type(VOLUME)} == {f"/pool/{bases[0].inputs['name']}"}


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
    mocks = RecordingMocks(computed=COMPUTED)
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

    assert (domain["vcpus"], domain["memoryMib"]) == (2, 1024)
    assert domain["diskPath"] == "/pool/px-crawl-a.qcow2"
    assert domain["cidataPath"] == f"/pool/{mocks.one(CLOUD_INIT).inputs['name']}"
    assert domain["network"] == "default"
    assert domain["domainType"] == "kvm"  # the catalogue's default
    assert domain["leaseTimeout"] > 0
    assert domain["description"] == "managed-by=proxy-operator proxy=crawl/a stack=kvm-home"
    assert outputs["proxies"]["crawl/a"] == {
        "host": LEASE,
        "port": 3128,
        "protocol": "http",
        "instanceId": "crawl/a-id",
    }


def test_the_catalogue_domain_type_reaches_the_domain(mocks: RecordingMocks) -> None:
    entry = KvmProvider.model_validate({**ENTRY.model_dump(by_alias=True), "domainType": "qemu"})
    run(entry=entry, proxies=[proxy("a", provider="kvm-home")], settings=SETTINGS)
    assert mocks.one(DOMAIN).inputs["domainType"] == "qemu"
    with pytest.raises(ValueError, match="domainType"):
        KvmProvider.model_validate({**ENTRY.model_dump(by_alias=True), "domainType": "xen"})


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
    libvirt_inputs = [r.inputs for r in mocks.resources if "Libvirt" in r.typ]

    assert {r.typ for r in mocks.resources if "Libvirt" in r.typ} >= {VOLUME, DOMAIN, CLOUD_INIT}
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
        recording = RecordingMocks(computed=COMPUTED)
        install(recording, stack="kvm-home")
        given = {"crawl/a": {"username": "crawler", "password": password}}
        spec = {"provider": "kvm-home", "auth": {"mode": "secret", "secretRef": {"name": "a-auth"}}}
        run(entry=ENTRY, proxies=[proxy("a", **spec)], settings=SETTINGS, credentials=given)
        disks.append(recording.one(CLOUD_INIT).inputs)
        assert recording.one(GUEST_CREDENTIALS).inputs["password"]["value"] == password

    assert disks[0] == disks[1]
