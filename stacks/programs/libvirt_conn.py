"""Connections to a KVM host for the kvm program's libvirt resources (`libvirt_volumes`, `libvirt_cidata`,
`libvirt_domain`), with libvirt-python.

The catalogue keeps `qemu+ssh://user@host[:port]/system` URIs, and the program dials them as they are, over
libvirt's `ssh` transport, which runs OpenSSH: its `command` parameter names a small wrapper of ours that
runs `ssh` with the mounted key and known_hosts only, host keys verified (`StrictHostKeyChecking=yes`),
no prompt, no user or system configuration: the same options as the credentials delivery and the orphan
finder (`stacks/kvm_ssh.py`); any port. (libvirt's own `qemu+ssh` ignores a `knownhosts` parameter, and
its `qemu+libssh` transport, which honours one, froze here in `virStreamFinish` after a whole image upload
under load, a known fault of that transport: docs/decisions.md.) A URI of another scheme
(`test:///default` in the unit tests, `qemu:///system` on the host itself) is used as it is.

A host key that the known_hosts file does not hold is `HostKeyRejectedError`: an `InvalidInputError`, so the
automation stalls the stack with the message (the host and the fix) instead of retrying.

libvirt-python (the `[kvm]` extra) is imported on first use, here only, so a stack of another type never
loads it and a missing install says what to do.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shlex
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from stacks.kvm_ssh import ssh_options
from stacks.programs.component import InvalidInputError

KEY_FILE = "id_ed25519"
KNOWN_HOSTS_FILE = "known_hosts"
# Ours to set; any value the catalogue carries for these is replaced (no_verify is refused by the model).
SSH_PARAMETERS = (
    "command", "keyfile", "knownhosts", "known_hosts", "known_hosts_verify", "no_verify", "no_tty", "sshauth",
)  # fmt: skip


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
    """A catalogue `qemu+ssh://` URI with our `ssh` wrapper as its command (the mounted key and known_hosts,
    verified); another scheme as it is."""
    parts = urlsplit(uri)
    if parts.scheme != "qemu+ssh":
        return uri
    query = [(key, value) for key, value in parse_qsl(parts.query) if key not in SSH_PARAMETERS]
    query += [("command", str(ssh_command(ssh_dir))), ("no_tty", "1")]
    return urlunsplit(parts._replace(query=urlencode(query, safe="/")))


# libvirt reads at most 1 KiB of a failed transport's stderr ("Value too large for defined data type"
# beyond), and OpenSSH's refusal of a changed host key is longer (a banner of `@` lines, the fingerprint,
# the known_hosts path): ssh's stderr goes to an unlinked file, and on failure its end, without the banner,
# comes back on the wrapper's own stderr.
WRAPPER = """#!/bin/sh
# proxy-operator: ssh with the mounted key and known_hosts only (stacks/programs/libvirt_conn.py)
err=$(mktemp) || exit 255
exec 3>"$err" 4<"$err"
rm -f "$err"
ssh OPTIONS "$@" 2>&3 3>&- 4<&-
status=$?
if [ "$status" -ne 0 ]; then
  grep -v '^@' <&4 | tr -s '\\r\\n' '  ' | tail -c 900 >&2
fi
exit "$status"
"""


def ssh_command(ssh_dir: str) -> Path:
    """The wrapper libvirt runs instead of `ssh`: written once per SSH folder into a folder only this user
    can write (a 0700 folder of ours under the temporary directory; anything else there is refused)."""
    text = WRAPPER.replace("OPTIONS", shlex.join(ssh_options(ssh_dir)))
    folder = Path(tempfile.gettempdir()) / f"proxy-operator-ssh-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RuntimeError(f"{folder} is not a private folder of this user: remove it and run again")
    path = folder / f"ssh-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    if not path.exists():
        # A file of its own for each writer (threads of one provider process dial at once), closed before
        # the rename: libvirt must never exec a file that is still being written (ETXTBSY, or half a script).
        handle, partial = tempfile.mkstemp(dir=folder, prefix=".ssh-")
        with os.fdopen(handle, "w") as out:
            out.write(text)
            os.fchmod(out.fileno(), 0o700)
        os.replace(partial, path)
    return path


def host_label(uri: str) -> str:
    """`host:port` as known_hosts must record it (`[host]:port` for a port other than 22)."""
    parts = urlsplit(uri)
    host = parts.hostname or "localhost"
    return f"[{host}]:{parts.port}" if parts.port and parts.port != 22 else host


def _translated(exc: Exception, uri: str, ssh_dir: str) -> Exception:
    text = said(str(exc))
    if "host key" in text.lower() or "host identification has changed" in text.lower():
        parts = urlsplit(uri)
        scan = f"ssh-keyscan -p {parts.port or 22} {parts.hostname}"
        # What to do first and short: the CLI's diagnostics may cut a long line.
        return HostKeyRejectedError(
            f"InvalidInput: the SSH host key of KVM host {host_label(uri)} was refused: put the host's key "
            f"for '{host_label(uri)}' in the known_hosts of the kvm SSH Secret ({scan}; "
            f"docs/kvm-provider.md, step 3); nothing was created. Mounted at {ssh_dir}; ssh said: {text}"
        )
    return RuntimeError(f"cannot connect to KVM host {host_label(uri)} ({uri}): {text}")


def said(text: str, *, limit: int = 400) -> str:
    """What libvirt relayed of ssh's stderr, on one line: OpenSSH's `@@@` banners and blank runs dropped."""
    words = [word for word in text.split() if set(word) != {"@"}]
    line = " ".join(words)
    return line if len(line) <= limit else line[: limit - 3] + "..."


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
