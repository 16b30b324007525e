"""Fixtures of the tests against a real KVM host (tests/kvm/host.py) and the guest images they boot.

`kvm_host` starts libvirtd, virtlogd and sshd in a namespace of their own once per session, on first use;
`fast_image` and `full_image` build the guest images (scripts/build-kvm-image.sh, cached outside the clone)
or find them; `libvirt` is the libvirt-python module. When a part is missing or does not start, the tests
that use them fail (never skip) with what to do: a missing libvirtd is a broken install (`make kvm-deps`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.kvm.host import KvmHost, KvmHostUnavailable, libvirt_module, running_kvm_host
from tests.kvm.images import GuestImage, ImageUnavailable, guest_image


def _sayer(config: pytest.Config, tag: str) -> Callable[[str], None]:
    capture = config.pluginmanager.getplugin("capturemanager")

    def say(line: str) -> None:
        with capture.global_and_fixture_disabled():
            print(f"\n[{tag}] {line}", end="", flush=True)

    return say


@pytest.fixture(scope="package", autouse=True)
def own_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """TMPDIR for tests/kvm and every process they start: the ssh wrapper the kvm program writes (one per
    SSH folder, `proxy-operator-ssh-<uid>/` under the temporary directory: libvirt_conn.py) goes into the
    tests' own folders, not the machine's /tmp."""
    folder = tmp_path_factory.mktemp("tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(folder))
        patch.setattr(tempfile, "tempdir", None)  # read TMPDIR again in this process too
        yield folder


@pytest.fixture(scope="session")
def libvirt() -> Any:
    try:
        return libvirt_module()
    except KvmHostUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="package")
def kvm_host(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[KvmHost]:
    """The test KVM host for tests/kvm, stopped after its last test (one per machine and slot at a time:
    `PROXY_OPERATOR_KVM_HOST_SLOT`, tests/kvm/namespace.py)."""
    workdir = tmp_path_factory.mktemp("kvm", numbered=True)
    failure = ""
    with ExitStack() as stack:
        try:
            host = stack.enter_context(running_kvm_host(workdir, say=_sayer(pytestconfig, "kvm-host")))
        except KvmHostUnavailable as exc:
            failure = str(exc)
        if failure:
            pytest.fail(failure, pytrace=False)
        yield host


def _image(variant: str, factory: pytest.TempPathFactory, config: pytest.Config) -> GuestImage:
    say = _sayer(config, "kvm-image")
    say(f"building or finding the {variant} guest image (scripts/build-kvm-image.sh {variant})")
    try:
        image = guest_image(variant, log=factory.mktemp("kvm-image") / f"{variant}.log")
    except ImageUnavailable as exc:
        pytest.fail(f"the {variant} guest image cannot be built: {exc}", pytrace=False)
    say(f"{variant} image {'found' if image.reused else 'built'} in {image.seconds:.1f} s: {image.path}")
    return image


@pytest.fixture(scope="session")
def fast_image(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> GuestImage:
    """The fast-boot guest image (a small init instead of systemd): the one most tests boot."""
    return _image("fast", tmp_path_factory, pytestconfig)


@pytest.fixture(scope="session")
def full_image(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> GuestImage:
    """The full systemd guest image, the one docs/kvm-provider.md tells users to build."""
    return _image("full", tmp_path_factory, pytestconfig)


@pytest.fixture
def say(pytestconfig: pytest.Config) -> Callable[[str], None]:
    return _sayer(pytestconfig, "kvm")
