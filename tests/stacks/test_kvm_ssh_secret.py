"""scripts/kvm-ssh-secret.sh (`make kvm-ssh-secret`): the Secret from a private key and known_hosts."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "kvm-ssh-secret.sh"
KNOWN_HOSTS = "hv1.lan ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPlaceholderHostKey\n"


def _keypair(tmp_path: Path, passphrase: str = "") -> Path:
    keygen = shutil.which("ssh-keygen")
    assert keygen, "ssh-keygen is needed to make a test key"
    key = tmp_path / "id_ed25519"
    subprocess.run([keygen, "-q", "-t", "ed25519", "-N", passphrase, "-f", str(key)], check=True)
    (tmp_path / "known_hosts").write_text(KNOWN_HOSTS)
    return key


def _run(key: Path, known_hosts: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KVM_SSH_KEY": str(key), "KVM_KNOWN_HOSTS": str(known_hosts)}
    return subprocess.run(["bash", str(SCRIPT)], env=env, text=True, capture_output=True, check=False)


def test_refuses_a_public_key_by_name(tmp_path: Path) -> None:
    key = _keypair(tmp_path)
    result = _run(key.with_suffix(".pub"), tmp_path / "known_hosts")

    assert result.returncode == 1
    assert "is a public key: give the private key" in result.stderr
    assert f"KVM_SSH_KEY={key}" in result.stderr


def test_refuses_a_renamed_public_key_and_a_passphrase(tmp_path: Path) -> None:
    key = _keypair(tmp_path)
    renamed = tmp_path / "renamed"
    renamed.write_text(key.with_suffix(".pub").read_text())
    assert "is not a private key" in _run(renamed, tmp_path / "known_hosts").stderr

    locked_dir = tmp_path / "locked"
    locked_dir.mkdir()
    locked = _keypair(locked_dir, passphrase="secret")
    assert "has a passphrase" in _run(locked, locked_dir / "known_hosts").stderr


def test_refuses_a_missing_known_hosts(tmp_path: Path) -> None:
    key = _keypair(tmp_path)
    result = _run(key, tmp_path / "absent")

    assert result.returncode == 1
    assert "known_hosts" in result.stderr


def test_prints_the_secret_with_the_key_and_known_hosts(tmp_path: Path) -> None:
    key = _keypair(tmp_path)
    result = _run(key, tmp_path / "known_hosts")
    manifest = yaml.safe_load(result.stdout)

    assert result.returncode == 0, result.stderr
    assert (manifest["kind"], manifest["metadata"]["name"]) == ("Secret", "kvm-ssh")
    assert base64.b64decode(manifest["data"]["id_ed25519"]).decode() == key.read_text()
    assert base64.b64decode(manifest["data"]["known_hosts"]).decode() == KNOWN_HOSTS
