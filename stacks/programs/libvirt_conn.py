"""Connections to a KVM host for the kvm program's libvirt resources (`libvirt_volumes`, `libvirt_cidata`,
`libvirt_domain`), with libvirt-python.

The catalogue keeps `qemu+ssh://user@host[:port]/system` URIs. C libvirt's `qemu+ssh` transport runs the
`ssh` program and ignores a `knownhosts` parameter (it reads the user's own known_hosts), so the program
dials the same host over `qemu+libssh` instead, with the mounted key and known_hosts, host key verification
`normal` (never off) and public-key authentication only; any port. A URI of another scheme (`test:///default`
in the unit tests, `qemu:///system` on the host itself) is used as it is.

A host key that the known_hosts file does not hold is `HostKeyRejectedError`: an `InvalidInputError`, so the
automation stalls the stack with the message (the host and the fix) instead of retrying.

libvirt-python (the `[kvm]` extra) is imported on first use, here only, so a stack of another type never
loads it and a missing install says what to do.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from stacks.programs.component import InvalidInputError

KEY_FILE = "id_ed25519"
KNOWN_HOSTS_FILE = "known_hosts"
# Ours to set; any value the catalogue carries for these is replaced (no_verify is refused by the model).
SSH_PARAMETERS = ("keyfile", "knownhosts", "known_hosts", "known_hosts_verify", "no_verify", "sshauth")


class HostKeyRejectedError(InvalidInputError):
    """The KVM host's SSH key is not the one known_hosts records for it (or none is recorded)."""


class LibvirtMissingError(RuntimeError):
    """libvirt-python is not installed where the program's dynamic providers run."""


def libvirt_module() -> Any:
    """The `libvirt` module, its errors raised as exceptions only (not also printed on stderr)."""
    try:
        libvirt = importlib.import_module("libvirt")
    except ImportError as exc:
        raise LibvirtMissingError(
            "the kvm program needs libvirt-python: install proxy-operator with the [kvm] extra "
            "(`make kvm-python`; it builds against libvirt-dev, pkg-config and gcc)"
        ) from exc
    libvirt.registerErrorHandler(lambda *_: None, None)
    return libvirt


def connection_uri(uri: str, ssh_dir: str) -> str:
    """A catalogue `qemu+ssh://` URI as `qemu+libssh://` with the mounted key and known_hosts, verified."""
    parts = urlsplit(uri)
    if parts.scheme != "qemu+ssh":
        return uri
    folder = ssh_dir.rstrip("/")
    query = [(key, value) for key, value in parse_qsl(parts.query) if key not in SSH_PARAMETERS]
    query += [
        ("keyfile", f"{folder}/{KEY_FILE}"),
        ("known_hosts", f"{folder}/{KNOWN_HOSTS_FILE}"),
        ("known_hosts_verify", "normal"),
        ("sshauth", "privkey"),
    ]
    return urlunsplit(parts._replace(scheme="qemu+libssh", query=urlencode(query, safe="/")))


def host_label(uri: str) -> str:
    """`host:port` as known_hosts must record it (`[host]:port` for a port other than 22)."""
    parts = urlsplit(uri)
    host = parts.hostname or "localhost"
    return f"[{host}]:{parts.port}" if parts.port and parts.port != 22 else host


def _translated(exc: Exception, uri: str, ssh_dir: str) -> Exception:
    text = str(exc)
    if "host key" in text.lower():
        return HostKeyRejectedError(
            f"InvalidInput: the SSH host key of KVM host {host_label(uri)} was refused ({text.strip()}): "
            f"record the host's key under '{host_label(uri)}' in the known_hosts of the kvm SSH Secret "
            f"(mounted at {ssh_dir}), e.g. with ssh-keyscan (docs/kvm-provider.md, step 3); nothing was "
            "created"
        )
    return RuntimeError(f"cannot connect to KVM host {host_label(uri)} ({uri}): {text.strip()}")


@contextmanager
def connected(uri: str, ssh_dir: str) -> Iterator[Any]:
    """An open `virConnect` to the host of a catalogue URI, closed on leaving."""
    libvirt = libvirt_module()
    try:
        conn = libvirt.open(connection_uri(uri, ssh_dir))
    except libvirt.libvirtError as exc:
        raise _translated(exc, uri, ssh_dir) from exc
    try:
        yield conn
    finally:
        conn.close()


def is_missing(exc: BaseException, *codes: str) -> bool:
    """Is `exc` libvirt's "no such object" error of one of `codes` (`VIR_ERR_NO_DOMAIN`, ...)?"""
    libvirt = libvirt_module()
    if not isinstance(exc, libvirt.libvirtError):
        return False
    return exc.get_error_code() in {getattr(libvirt, code) for code in codes}
