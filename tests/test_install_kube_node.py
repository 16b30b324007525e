"""scripts/install-kube-node.sh with a stand-in curl serving release files from a folder: the official
release is taken when its checksum matches, cached by version and linked; a wrong checksum falls back to the
Go build (a stand-in go that only fails here); a cached run fetches nothing; CoreDNS's cache follows its
plugin list (tools/coredns/main.go), and a binary without a listed plugin is refused."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from tests.conftest import ROOT

PROGRAMS = {
    "kube-scheduler": "#!/bin/sh\necho 'Kubernetes v1.37.2'\n",
    # like the full release: more plugins than tools/coredns lists
    "coredns": "#!/bin/sh\nif [ \"$1\" = -plugins ]; then printf '%s\\n' any bind cache errors forward"
    " kubernetes log template; else echo 'CoreDNS-1.15.0'; echo 'linux/amd64'; fi\n",
    "kube-router": "#!/bin/sh\necho kube-router\n",
}
CURL = """#!/bin/bash
out="" url=""
while [ $# -gt 0 ]; do case "$1" in -o) out="$2"; shift 2;; --connect-timeout|--max-time) shift 2;;
  -*) shift;; *) url="$1"; shift;; esac; done
file="$SERVED/${url##*/}"
[ -f "$file" ] || exit 22
echo "$url" >> "$SERVED/../fetched"
if [ -n "$out" ]; then cp "$file" "$out"; else cat "$file"; fi
"""


def _tgz(name: str, body: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(body), 0o755
        archive.addfile(info, io.BytesIO(body.encode()))
    return buffer.getvalue()


def _served(folder: Path, *, bad_checksum: bool = False) -> None:
    folder.mkdir()
    scheduler = PROGRAMS["kube-scheduler"].encode()
    (folder / "kube-scheduler").write_bytes(scheduler)
    digest = "0" * 64 if bad_checksum else hashlib.sha256(scheduler).hexdigest()
    (folder / "kube-scheduler.sha256").write_text(digest)
    for name, archive, sums in (
        ("coredns", "coredns_1.15.0_linux_amd64.tgz", "coredns_1.15.0_linux_amd64.tgz.sha256"),
        ("kube-router", "kube-router_2.1.0_linux_amd64.tar.gz", "kube-router_2.1.0_checksums.txt"),
    ):
        data = _tgz(name, PROGRAMS[name])
        (folder / archive).write_bytes(data)
        (folder / sums).write_text(f"{hashlib.sha256(data).hexdigest()}  {archive}\n")


def _clone(tmp_path: Path) -> Path:
    """The script, its helper and the wrappers' files in a scratch root (its .tools/bin is written)."""
    root = tmp_path / "root"
    (root / "scripts").mkdir(parents=True)
    for name in ("install-kube-node.sh", "cached-binary.sh"):
        shutil.copy(ROOT / "scripts" / name, root / "scripts" / name)
    for name in ("kube-apiserver/go.mod", "coredns/main.go", "coredns/go.mod", "coredns/go.sum"):
        (root / "tools" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "tools" / name, root / "tools" / name)
    return root


def _coredns_cache(root: Path) -> Path:
    """The cache folder the link .tools/bin/coredns points into: coredns-v1.15.0-<hash of tools/coredns>."""
    folder = (root / ".tools" / "bin" / "coredns").resolve().parent
    assert folder.name.startswith("coredns-v1.15.0-")
    assert len(folder.name) == len("coredns-v1.15.0-") + 12
    return folder


def _run(tmp_path: Path, root: Path) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "curl").write_text(CURL)
    (fake / "go").write_text("#!/bin/sh\necho 'go called' >&2\nexit 1\n")
    for tool in (fake / "curl", fake / "go"):
        tool.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{fake}:{os.environ['PATH']}",
        "SERVED": str(tmp_path / "served"),
        "PROXY_OPERATOR_CACHE_DIR": str(tmp_path / "cache"),
        "KUBE_NODE_ONLY": " ".join(PROGRAMS),
    }
    script = root / "scripts" / "install-kube-node.sh"
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)


def test_official_releases_are_taken_checked_cached_and_linked(tmp_path: Path) -> None:
    _served(tmp_path / "served")
    root = _clone(tmp_path)
    result = _run(tmp_path, root)
    assert result.returncode == 0, result.stderr
    for name, version in (("kube-scheduler", "v1.37.2"), ("coredns", "v1.15.0"), ("kube-router", "v2.1.0")):
        link = root / ".tools" / "bin" / name
        folder = _coredns_cache(root).name if name == "coredns" else f"{name}-{version}"
        assert link.resolve() == tmp_path / "cache" / folder / name
        assert link.read_text() == PROGRAMS[name]
    assert "go called" not in result.stderr
    fetched = (tmp_path / "fetched").read_text().splitlines()
    again = _run(tmp_path, root)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "fetched").read_text().splitlines() == fetched  # nothing fetched when cached
    assert again.stdout.count("nothing to do") == 3


def test_a_wrong_checksum_falls_back_to_the_go_build(tmp_path: Path) -> None:
    _served(tmp_path / "served", bad_checksum=True)
    result = _run(tmp_path, _clone(tmp_path))
    assert result.returncode == 1
    assert (
        "checksum mismatch: https://dl.k8s.io/release/v1.37.2/bin/linux/amd64/kube-scheduler" in result.stdout
    )
    assert "go called" in result.stderr
    assert not (tmp_path / "cache" / "kube-scheduler-v1.37.2" / "kube-scheduler").exists()


def _add_plugin(root: Path, after: str, plugin: str) -> None:
    main = root / "tools" / "coredns" / "main.go"
    text = main.read_text()
    assert f'\t"{after}",\n' in text
    main.write_text(text.replace(f'\t"{after}",\n', f'\t"{after}",\n\t"{plugin}",\n', 1))


def test_a_change_of_coredns_plugins_makes_it_again_and_a_missing_plugin_is_refused(tmp_path: Path) -> None:
    _served(tmp_path / "served")
    root = _clone(tmp_path)
    assert _run(tmp_path, root).returncode == 0
    first = _coredns_cache(root)
    _add_plugin(root, "errors", "log")  # the stand-in release has log
    again = _run(tmp_path, root)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("nothing to do") == 2  # kube-scheduler and kube-router only
    second = _coredns_cache(root)
    assert second != first
    assert (first / "coredns").exists()
    assert (second / "coredns").exists()
    _add_plugin(root, "cache", "nomad")  # the stand-in has no nomad: downloaded, then refused
    refused = _run(tmp_path, root)
    assert refused.returncode == 1
    assert "the coredns made at" in refused.stderr
    assert "is not coredns v1.15.0" in refused.stderr
    assert _coredns_cache(root) == second
