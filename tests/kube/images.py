"""The test node's container images, made from Debian packages with no registry (none is reachable here).

`node_images()` returns two docker-archive tarballs, built once and cached OUTSIDE the clone keyed by what
went into them (the cache folder of scripts/cached-binary.sh):
- `localhost/pause:pon`, containerd's sandbox image: a `gcc -static` C program that waits for a signal and
  reaps children (what the upstream pause image does);
- `localhost/busybox:pon`, the test pods' image: Debian's busybox-static (fetched with `apt-get download`)
  with the applets the tests use linked in /bin, and /www/index.html holding one byte for `httpd` to serve.
Both are loaded into the node with `ctr -n k8s.io images import` (tests/kube/node.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

PAUSE_IMAGE = "localhost/pause:pon"
BUSYBOX_IMAGE = "localhost/busybox:pon"
SERVED_BYTE = b"k"  # what the busybox image's /www/index.html holds
APPLETS = [
    "sh",
    "sleep",
    "cat",
    "echo",
    "nc",
    "wget",
    "nslookup",
    "httpd",
    "id",
    "touch",
    "ls",
    "true",
    "grep",
    "seq",
]  # linked to busybox
PAUSE_C = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
static void quit(int s) { (void)s; _exit(0); }
int main(void) {
    signal(SIGINT, quit); signal(SIGTERM, quit); signal(SIGCHLD, reap);
    for (;;) pause();
}
"""


class ImageUnavailable(RuntimeError):
    """An image could not be made; the message says which step failed and its output."""


@dataclass(frozen=True)
class Images:
    pause: Path
    busybox: Path


def cache_root() -> Path:
    """The folder scripts/cached-binary.sh keeps builds in (shared by every clone)."""
    base = os.environ.get("PROXY_OPERATOR_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "proxy-operator"


def run(argv: list[str], *, cwd: Path | None = None) -> None:
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ImageUnavailable(f"`{' '.join(argv)}` failed ({result.returncode}): {result.stderr[-1500:]}")


def node_images() -> Images:
    """Both images' tarballs, made now if the cache lacks them."""
    folder = cache_root() / "node-images"
    folder.mkdir(parents=True, exist_ok=True)
    return Images(pause=pause_archive(folder), busybox=busybox_archive(folder))


def pause_archive(folder: Path) -> Path:
    key = hashlib.sha256(PAUSE_C.encode()).hexdigest()[:16]
    out = folder / f"pause-{key}.tar"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        (work / "pause.c").write_text(PAUSE_C)
        run(["gcc", "-static", "-Os", "-s", "-o", "pause", "pause.c"], cwd=work)
        files = {"pause": ((work / "pause").read_bytes(), 0o755)}
        write_archive(out, tag=PAUSE_IMAGE, files=files, links={}, config={"Entrypoint": ["/pause"]})
    return out


def busybox_archive(folder: Path) -> Path:
    """Keyed by the package version apt would fetch: with the tarball cached, nothing is downloaded."""
    policy = subprocess.run(["apt-cache", "policy", "busybox-static"], capture_output=True, text=True).stdout
    candidate = next((line.split()[-1] for line in policy.splitlines() if "Candidate:" in line), "")
    key = hashlib.sha256(f"{candidate} {' '.join(APPLETS)} {SERVED_BYTE!r}".encode()).hexdigest()[:16]
    out = folder / f"busybox-{key}.tar"
    if candidate and out.exists():
        return out
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        run(["apt-get", "download", "-q", "busybox-static"], cwd=work)
        (deb,) = work.glob("busybox-static_*.deb")
        run(["dpkg-deb", "-x", str(deb), "root"], cwd=work)
        files = {
            "bin/busybox": ((work / "root/bin/busybox").read_bytes(), 0o755),
            "www/index.html": (SERVED_BYTE, 0o644),
        }
        links = {f"bin/{applet}": "busybox" for applet in APPLETS}
        config = {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"], "User": "10001:10001"}
        write_archive(out, tag=BUSYBOX_IMAGE, files=files, links=links, config=config)
    return out


def write_archive(
    out: Path,
    *,
    tag: str,
    files: dict[str, tuple[bytes, int]],
    links: dict[str, str],
    config: dict[str, object],
) -> None:
    """A docker-archive (`docker save` layout) with one layer, written atomically."""
    layer = layer_tar(files=files, links=links)
    diff_id = hashlib.sha256(layer).hexdigest()
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": [f"{diff_id}/layer.tar"]}]
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as archive:
        add_bytes(archive, config_name, config_bytes)
        add_bytes(archive, f"{diff_id}/layer.tar", layer)
        add_bytes(archive, "manifest.json", json.dumps(manifest).encode())
    tmp.replace(out)


def layer_tar(*, files: dict[str, tuple[bytes, int]], links: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as layer:
        for folder in sorted({str(Path(p).parent) for p in [*files, *links]} | {"tmp"}):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            layer.addfile(info)
        for path, (data, mode) in sorted(files.items()):
            add_bytes(layer, path, data, mode=mode)
        for path, target in sorted(links.items()):
            info = tarfile.TarInfo(path)
            info.type, info.linkname = tarfile.SYMTYPE, target
            layer.addfile(info)
    return buffer.getvalue()


def add_bytes(archive: tarfile.TarFile, name: str, data: bytes, *, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    archive.addfile(info, io.BytesIO(data))


def main() -> None:
    """`python -m tests.kube.images`: make (or find) both tarballs and print where they are."""
    if not shutil.which("gcc"):
        raise SystemExit("gcc is missing: make system-deps test set (scripts/install-system-deps.sh test)")
    images = node_images()
    print(f"[kube-node] images: {images.pause} {images.busybox}")


if __name__ == "__main__":
    main()
