"""The kvm program's libvirt dynamic providers, called directly against libvirt's built-in `test:///default`
driver: a real libvirt API (volumes, backing stores, domains, states, lease addresses) with no daemon and no
guest. That driver keeps its objects only while a connection is open, so `test_conn` holds one for each test.

Not here, because the test driver lacks them: uploads (`virStorageVolUpload`: the base image and the cidata
ISO), SSH transport and host keys, a real boot. tests/kvm/test_program_kvm_engine.py runs those against the
test KVM host. Nothing is mocked here.
"""

from __future__ import annotations

import os
import secrets
import shlex
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from stacks.programs.libvirt_cidata import write_iso
from stacks.programs.libvirt_conn import HostKeyRejectedError, _translated, connection_uri, libvirt_module
from stacks.programs.libvirt_domain import DomainProvider, _kvm_hint, domain_xml, fresh_disk
from stacks.programs.libvirt_guest import GuestStartError, wait_for_address
from stacks.programs.libvirt_resource import find_pool
from stacks.programs.libvirt_upload import image_format, volume_xml
from stacks.programs.libvirt_volumes import BaseVolumeProvider, ProxyVolumeProvider

TEST_URI = "test:///default"
POOL = "default-pool"
GIB = 1024**3


@pytest.fixture(autouse=True)
def own_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ssh wrapper (libvirt_conn.py, under the temporary directory) goes into the test's own folder."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)


@pytest.fixture
def test_conn() -> Iterator[Any]:
    libvirt = libvirt_module()
    conn = libvirt.open(TEST_URI)
    try:
        yield conn
    finally:
        conn.close()


def _outs(result: Any) -> dict[str, Any]:
    assert result.outs is not None
    return dict(result.outs)


def _unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def _where(**props: Any) -> dict[str, Any]:
    return {"uri": TEST_URI, "sshDir": "/nowhere", **props}


def _base(conn: Any) -> Any:
    pool = conn.storagePoolLookupByName(POOL)
    return pool.createXML(volume_xml(name=_unique("base") + ".qcow2", capacity=2 * GIB, fmt="qcow2"), 0)


# --- the connection ---------------------------------------------------------------------------------------


def test_a_catalogue_uri_runs_our_ssh_wrapper_with_the_mounted_key_and_known_hosts_verified() -> None:
    uri = connection_uri(
        "qemu+ssh://virt@hv1.lan:2222/system?socket=/run/libvirt/libvirt-sock&no_verify=1&knownhosts=/x"
        "&command=/bin/evil&keyfile=/other",
        "/etc/proxy-operator/kvm/",
    )
    parts = urlsplit(uri)
    assert (parts.scheme, parts.username, parts.hostname, parts.port, parts.path) == (
        "qemu+ssh",
        "virt",
        "hv1.lan",
        2222,
        "/system",
    )
    query = parse_qs(parts.query)
    [command] = query.pop("command")
    assert query == {
        "socket": ["/run/libvirt/libvirt-sock"],  # the catalogue's own parameters stay
        "no_tty": ["1"],  # never off: no_verify, knownhosts, keyfile and command are ours to set
    }
    wrapper = Path(command)
    assert wrapper.stat().st_mode & 0o777 == 0o700
    assert wrapper.parent.stat().st_mode & 0o777 == 0o700
    [line] = [line for line in wrapper.read_text().splitlines() if line.startswith("ssh ")]
    argv = shlex.split(line)
    assert argv[-4:] == ["$@", "2>&3", "3>&-", "4<&-"]
    flags, values = argv[1:-4:2], argv[2:-4:2]
    options = dict(zip(flags, values, strict=True))
    assert options["-F"] == "/dev/null"
    assert options["-i"] == "/etc/proxy-operator/kvm/id_ed25519"
    given = [value for flag, value in zip(flags, values, strict=True) if flag == "-o"]
    assert "StrictHostKeyChecking=yes" in given
    assert "UserKnownHostsFile=/etc/proxy-operator/kvm/known_hosts" in given
    assert "GlobalKnownHostsFile=/dev/null" in given
    assert "BatchMode=yes" in given
    assert connection_uri(uri.replace("/system", "/system"), "/etc/proxy-operator/kvm/") == uri  # stable
    assert connection_uri(TEST_URI, "/x") == TEST_URI


def test_the_ssh_wrapper_gives_libvirt_a_short_stderr_that_keeps_the_reason(tmp_path: Path) -> None:
    """libvirt reads at most 1 KiB of a failed transport's stderr ("Value too large for defined data type"
    beyond: seen in CI with a long known_hosts path in OpenSSH's changed-key banner). A stand-in `ssh` prints
    that banner and fails; what comes out is short, banner-free, and ends with the reason. A session that
    succeeds passes its exit status and stdout through."""
    fake = tmp_path / "bin"
    fake.mkdir()
    banner = OPENSSH_CHANGED.replace("Cannot recv data: ", "").replace(": Connection reset by peer", "")
    banner = banner.replace(
        "Host key verification failed.",
        f"Offending ED25519 key in {tmp_path}/{'pytest-of-root-' * 8}/known_hosts:1\n"
        "Host key verification failed.",
    )
    assert len(banner) > 1024
    (fake / "ssh").write_text(
        "#!/bin/sh\n"
        "case \"$*\" in *fail*) cat >&2 <<'EOF'\n" + banner + "\nEOF\n    exit 255 ;; esac\necho session-ok\n"
    )
    (fake / "ssh").chmod(0o755)
    uri = connection_uri("qemu+ssh://virt@hv1.lan/system", str(tmp_path / "k" / ("long-path-" * 30)))
    [command] = parse_qs(urlsplit(uri).query)["command"]
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}

    refused = subprocess.run([command, "-p", "22", "hv1.lan", "fail"], capture_output=True, env=env)
    assert refused.returncode == 255
    assert len(refused.stderr) <= 1024
    assert refused.stderr.decode().rstrip().endswith("Host key verification failed.")
    assert b"@@@" not in refused.stderr

    fine = subprocess.run([command, "hv1.lan"], capture_output=True, env=env)
    assert (fine.returncode, fine.stdout, fine.stderr) == (0, b"session-ok\n", b"")


def test_the_ssh_wrapper_folder_must_be_private() -> None:
    folder = Path(tempfile.gettempdir()) / f"proxy-operator-ssh-{os.getuid()}"
    connection_uri("qemu+ssh://virt@hv1.lan/system", "/k")
    folder.chmod(0o777)
    try:
        with pytest.raises(RuntimeError, match="is not a private folder"):
            connection_uri("qemu+ssh://virt@hv1.lan/system", "/k")
    finally:
        folder.chmod(0o700)


def test_a_refused_host_key_is_a_permanent_error_naming_the_host_and_the_fix() -> None:
    error = _translated(
        Exception("authentication failed: SSH HOST KEY VERIFICATION FAILED"),
        "qemu+ssh://root@10.0.0.2:2222/system",
        "/etc/proxy-operator/kvm",
    )
    assert isinstance(error, HostKeyRejectedError)
    text = str(error)
    assert text.startswith("InvalidInput: ")  # read as permanent by automation/engine/errors.py
    assert "[10.0.0.2]:2222" in text
    assert "known_hosts" in text
    assert "ssh-keyscan" in text
    other = _translated(Exception("Connection refused"), "qemu+ssh://root@kvm1/system", "/k")
    assert not isinstance(other, HostKeyRejectedError)
    assert "kvm1" in str(other)


OPENSSH_CHANGED = (
    """Cannot recv data: @@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
Someone could be eavesdropping on you right now (man-in-the-middle attack)!
It is also possible that a host key has just been changed.
"""
    + "The fingerprint for the ED25519 key sent by the remote host is SHA256:x. " * 8
    + """
Host key verification failed.: Connection reset by peer"""
)


def test_openssh_refusing_a_changed_host_key_says_the_fix_first() -> None:
    """What libvirt relays of OpenSSH's refusal (seen on the test KVM host): the banner, then the reason; the
    fix comes first, so a shortened message (the Proxy's condition) still carries it."""
    error = _translated(Exception(OPENSSH_CHANGED), "qemu+ssh://root@10.0.0.2:2222/system", "/k")
    assert isinstance(error, HostKeyRejectedError)
    text = str(error)
    assert text.index("known_hosts") < 200
    assert "@@@" not in text
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in text
    assert len(text) < 800


def test_a_pool_busy_with_an_upload_is_used_without_a_refresh() -> None:
    """libvirt refuses to refresh a pool while a volume uploads into it (another resource made at the same
    time): seen on the test KVM host; anything else still fails."""

    class Pool:
        def __init__(self, error: str) -> None:
            self.error = error

        def isActive(self) -> bool:
            return True

        def refresh(self, _flags: int) -> None:
            raise RuntimeError(self.error)

    class Conn:
        def __init__(self, pool: Pool) -> None:
            self.pool = pool

        def storagePoolLookupByName(self, _name: str) -> Pool:
            return self.pool

    busy = Pool("internal error: pool 'default' has asynchronous jobs running.")
    assert find_pool(Conn(busy), "default") is busy
    with pytest.raises(RuntimeError, match="storage pool is not active"):
        find_pool(Conn(Pool("storage pool is not active")), "default")


# --- volumes --------------------------------------------------------------------------------------------


def test_a_proxy_volume_backs_onto_the_base_and_is_found_gone_after_delete(test_conn: Any) -> None:
    base = _base(test_conn)
    provider = ProxyVolumeProvider()
    props = _where(
        pool=POOL, name=_unique("px") + ".qcow2", basePath=base.path(), sizeBytes=10 * GIB, path=None
    )

    made = provider.create(props)
    volume = test_conn.storagePoolLookupByName(POOL).storageVolLookupByName(props["name"])
    xml = volume.XMLDesc(0)
    assert f"<path>{base.path()}</path>" in xml.split("<backingStore>")[1]
    assert volume.info()[1] == 10 * GIB
    assert _outs(made)["path"] == volume.path()
    assert provider.read(made.id, _outs(made)).id == made.id

    provider.delete(made.id, _outs(made))
    assert provider.read(made.id, _outs(made)).id == ""  # refresh drops it
    provider.delete(made.id, _outs(made))  # a second delete finds nothing to do
    assert base.name() in test_conn.storagePoolLookupByName(POOL).listVolumes()


def test_the_base_volume_is_never_deleted_nor_replaced_for_a_new_source(test_conn: Any) -> None:
    base = _base(test_conn)
    provider = BaseVolumeProvider()
    props = _where(pool=POOL, name=base.name(), source="/images/a.qcow2", path=base.path())

    provider.delete(base.key(), props)
    assert base.name() in test_conn.storagePoolLookupByName(POOL).listVolumes()
    assert _outs(provider.read(base.key(), props))["path"] == base.path()
    new_source = provider.diff(base.key(), props, {**props, "source": "/images/b.qcow2", "path": None})
    assert (new_source.changes, new_source.replaces) == (False, [])
    moved = provider.diff(base.key(), props, {**props, "sshDir": "/elsewhere"})
    assert (moved.changes, moved.replaces) == (True, [])  # how to reach the host is not what the volume is
    other_host = provider.diff(base.key(), props, {**props, "uri": "qemu+ssh://root@hv2/system"})
    assert other_host.replaces == ["uri"]


def test_a_leftover_base_volume_of_that_name_is_neither_reused_nor_overwritten(test_conn: Any) -> None:
    base = _base(test_conn)
    props = _where(pool=POOL, name=base.name(), source="/does/not/matter.qcow2", path=None)
    with pytest.raises(RuntimeError, match=f"a volume {base.name()} is already in pool {POOL}.*vol-delete"):
        BaseVolumeProvider().create(props)


def test_image_format_reads_the_qcow2_virtual_size(tmp_path: Path) -> None:
    image = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "3G"], check=True)
    assert image_format(image) == ("qcow2", 3 * GIB)
    raw = tmp_path / "disk.img"
    raw.write_bytes(b"\0" * 4096)
    assert image_format(raw) == ("raw", 4096)


def test_the_cidata_iso_is_labelled_cidata_and_holds_the_three_files(tmp_path: Path) -> None:
    files = {
        "user-data": "#cloud-config\n",
        "meta-data": "instance-id: a\n",
        "network-config": "version: 2\n",
    }
    iso = write_iso(files, tmp_path / "cidata.iso")
    descriptor = iso.read_bytes()[0x8000:0x8800]
    assert descriptor[1:6] == b"CD001"
    assert descriptor[40:72].decode().strip() == "cidata"  # what NoCloud looks for
    listing = subprocess.run(
        ["isoinfo", "-R", "-f", "-i", str(iso)], capture_output=True, text=True, check=True
    )
    assert sorted(listing.stdout.split()) == ["/meta-data", "/network-config", "/user-data"]
    extracted = subprocess.run(
        ["isoinfo", "-R", "-x", "/user-data", "-i", str(iso)], capture_output=True, text=True, check=True
    )
    assert extracted.stdout == "#cloud-config\n"


# --- the domain -----------------------------------------------------------------------------------------


def _domain_props(name: str, **changes: Any) -> dict[str, Any]:
    return _where(**{**_domain_base(name), "domainType": "test", **changes})


def _domain_base(name: str) -> dict[str, Any]:
    return dict(
        name=name,
        description="managed-by=proxy-operator proxy=crawl/a stack=kvm-home",
        vcpus=1,
        memoryMib=512,
        diskPath="/default-pool/px.qcow2",
        diskSize=10 * GIB,
        cidataPath="/default-pool/px-cloudinit.iso",
        network="default",
        leaseTimeout=5,
        address=None,
        uuid=None,
        running=True,
    )


def test_a_new_domain_gets_its_overlay_made_again_from_the_same_base(test_conn: Any) -> None:
    """What a new domain boots: its copy-on-write volume made anew (same name, size and backing image), not
    what a lost VM left on it. (The test driver keeps no bytes: the real host's drift test boots it.)"""
    pool = test_conn.storagePoolLookupByName(POOL)
    base = _base(test_conn)
    name = _unique("px") + ".qcow2"
    overlay = pool.createXML(volume_xml(name=name, capacity=3 * GIB, fmt="qcow2", backing=base.path()), 0)
    before = overlay.key()
    fresh_disk(test_conn, overlay.path())
    again = pool.storageVolLookupByName(name)
    assert again.path() == overlay.path()
    assert again.info()[1] == 3 * GIB
    assert f"<path>{base.path()}</path>" in again.XMLDesc(0)
    assert again.key() == before  # the same volume as far as the stack knows (its id and path)
    fresh_disk(test_conn, "/default-pool/not-a-volume.qcow2")  # unknown: left to the domain's start


def test_a_domain_is_defined_started_addressed_and_removed(test_conn: Any) -> None:
    provider = DomainProvider()
    props = _domain_props(_unique("px"))
    made = provider.create(props)

    domain = test_conn.lookupByUUIDString(made.id)
    assert domain.name() == props["name"]
    assert domain.isActive()
    assert domain.autostart()
    assert _outs(made)["address"].startswith("192.168.122.")
    assert _outs(made)["uuid"] == made.id
    xml = domain.XMLDesc(0)
    assert "<description>managed-by=proxy-operator proxy=crawl/a stack=kvm-home</description>" in xml
    assert "org.qemu.guest_agent.0" in xml
    assert "/default-pool/px-cloudinit.iso" in xml

    provider.delete(made.id, _outs(made))
    assert props["name"] not in [d.name() for d in test_conn.listAllDomains()]
    assert provider.read(made.id, _outs(made)).id == ""


def test_drift_a_domain_stopped_by_hand_is_started_again_one_removed_is_gone(test_conn: Any) -> None:
    provider = DomainProvider()
    made = provider.create(_domain_props(_unique("px")))
    domain = test_conn.lookupByUUIDString(made.id)

    assert _outs(provider.read(made.id, {**_outs(made), "address": "stale"}))["address"] != "stale"
    domain.destroy()
    read = provider.read(made.id, _outs(made))
    assert _outs(read)["running"] is False
    wanted = {**_outs(made), "running": True, "address": None, "uuid": None}
    diff = provider.diff(made.id, _outs(read), wanted)
    assert (diff.changes, diff.replaces) == (True, [])
    updated = provider.update(made.id, _outs(read), wanted)
    assert domain.isActive()
    assert _outs(updated)["address"].startswith("192.168.122.")

    domain.destroy()
    domain.undefine()
    assert provider.read(made.id, _outs(made)).id == ""


def test_what_the_vm_is_made_of_replaces_it_a_description_is_set_in_place(test_conn: Any) -> None:
    provider = DomainProvider()
    made = provider.create(_domain_props(_unique("px")))
    for key, value in (("memoryMib", 1024), ("domainType", "qemu"), ("cidataPath", "/other.iso")):
        assert provider.diff(made.id, _outs(made), {**_outs(made), key: value}).replaces == [key]

    described = {
        **_outs(made),
        "description": "managed-by=proxy-operator proxy=crawl/a stack=s installation=i",
    }
    assert provider.diff(made.id, _outs(made), described).replaces == []
    provider.update(made.id, _outs(made), described)
    assert "installation=i" in test_conn.lookupByUUIDString(made.id).XMLDesc(0)
    provider.delete(made.id, _outs(made))


def test_a_paused_kvm_domain_fails_at_once_with_the_fix(test_conn: Any) -> None:
    libvirt = libvirt_module()
    name = _unique("px")
    provider = DomainProvider()
    made = provider.create(_domain_props(name))
    domain = test_conn.lookupByUUIDString(made.id)
    domain.suspend()  # what an emulation failure leaves: the domain paused
    assert domain.state()[0] == libvirt.VIR_DOMAIN_PAUSED

    started = time.monotonic()
    with pytest.raises(
        GuestStartError, match=rf"the domain {name} paused.*set domainType: qemu in the catalogue"
    ):
        wait_for_address(domain, domain_type="kvm", timeout=300)
    assert time.monotonic() - started < 5  # not at the deadline
    with pytest.raises(GuestStartError) as qemu:
        wait_for_address(domain, domain_type="qemu", timeout=300)
    assert "domainType" not in str(qemu.value)
    provider.delete(made.id, _outs(made))


def test_a_domain_name_already_taken_fails_and_leaves_the_other_alone(test_conn: Any) -> None:
    provider = DomainProvider()
    props = _domain_props(_unique("px"))
    first = provider.create(props)
    with pytest.raises(RuntimeError, match=r"already exists.*skip-cleanup"):
        provider.create({**props, "description": "another"})
    assert test_conn.lookupByUUIDString(first.id).isActive()
    provider.delete(first.id, _outs(first))


def test_a_host_that_refuses_kvm_domains_says_to_set_domain_type_qemu() -> None:
    """libvirt's own refusal (no kvm capabilities, no /dev/kvm) at define or start, raised as libvirt does."""
    libvirt = libvirt_module()
    refusal = "invalid argument: could not find capabilities for domaintype=kvm"
    where = {"name": "px-a", "uri": "qemu+ssh://root@hv1/system"}
    hinted = pytest.raises(GuestStartError, match="set domainType: qemu in the catalogue entry")
    with hinted, _kvm_hint({**where, "domainType": "kvm"}):
        raise libvirt.libvirtError(refusal)
    with pytest.raises(libvirt.libvirtError), _kvm_hint({**where, "domainType": "qemu"}):
        raise libvirt.libvirtError(refusal)


def test_a_qemu_domain_bounds_its_translation_cache_a_kvm_one_has_none() -> None:
    assert "<tcg><tb-cache unit='MiB'>128</tb-cache></tcg>" in domain_xml(
        _domain_props("a", domainType="qemu")
    )
    assert "<tcg>" not in domain_xml(_domain_props("a", domainType="kvm"))
