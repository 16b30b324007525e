"""SSH to a KVM host with the mounted key and known_hosts: shared by the kvm program's credentials delivery
(`stacks/programs/kvm_credentials.py`) and `proxy-operator orphans` (`automation/orphans/kvm.py`)."""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, urlencode, urlsplit

DEFAULT_SSH_DIR = "/etc/proxy-operator/kvm"
SSH_DIR_ENV = "PROXY_OPERATOR_KVM_SSH_DIR"


def mounted_ssh_dir() -> str:
    """Where the key and known_hosts are mounted (the program's `kvmSshDir` default)."""
    return os.environ.get(SSH_DIR_ENV, DEFAULT_SSH_DIR)


def ssh_destination(host_uri: str) -> tuple[str, int, str]:
    """(user@host, port, the host's own libvirt URI) from a catalogue `qemu+ssh://` URI."""
    parts = urlsplit(host_uri)
    target = f"{parts.username}@{parts.hostname}" if parts.username else str(parts.hostname)
    query = [(key, value) for key, value in parse_qsl(parts.query) if key == "socket"]
    driver = parts.scheme.split("+", 1)[0]
    local = f"{driver}://{parts.path or '/system'}" + (f"?{urlencode(query, safe='/')}" if query else "")
    return target, parts.port or 22, local


def ssh_options(ssh_dir: str) -> list[str]:
    """OpenSSH's arguments for the mounted key and known_hosts only: host keys verified, no prompt, no user
    or system configuration. (OpenSSH keeps the first value of an option: these win over any given after.)"""
    folder = ssh_dir.rstrip("/")
    options = {
        "BatchMode": "yes",
        "IdentitiesOnly": "yes",
        "StrictHostKeyChecking": "yes",
        "UserKnownHostsFile": f"{folder}/known_hosts",
        "GlobalKnownHostsFile": "/dev/null",
        "ConnectTimeout": "30",
        "ServerAliveInterval": "30",
    }
    argv = ["-F", "/dev/null", "-i", f"{folder}/id_ed25519"]
    for key, value in options.items():
        argv += ["-o", f"{key}={value}"]
    return argv


def ssh_argv(*, target: str, port: int, ssh_dir: str) -> list[str]:
    """`ssh` to the host running a script fed on its stdin (`sh -s`), with `ssh_options`."""
    return ["ssh", *ssh_options(ssh_dir), "-p", str(port), target, "sh", "-s"]
