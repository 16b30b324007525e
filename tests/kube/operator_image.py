"""The service's own image for the test node: `make image` (scripts/build-image.sh) as an OCI archive.

The same image runs the service (deploy/deployment.yaml) and every proxy pod (`proxy-operator-forward-proxy`,
the kubernetes program's default image, stacks/models/wire.py). It is built from this checkout with the
script users run: Debian's packages for the base (mmdebstrap), PyPI for the virtual environment, the Pulumi
CLI and the Kubernetes plugin from .tools/bin. podman's storage and layer cache live outside the clone
(scripts/build-image.sh), so a build with an unchanged lock reuses the dependency layer and only the
package's own layer is made again. The archive is written beside that cache and imported into the node.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from stacks.models import DEFAULT_KUBERNETES_IMAGE
from tests.kube.apiserver import ROOT
from tests.kube.images import cache_root

BUILD_TIMEOUT = 1200.0  # a cold build: the Debian base, then every dependency from PyPI


class ImageBuildFailed(RuntimeError):
    """`make image` failed; the message carries the end of its output."""


def version() -> str:
    found = re.search(r'^version = "(.*)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    if not found:
        raise ImageBuildFailed("pyproject.toml has no version")
    return found.group(1)


def build_archive(*, say: Callable[[str], None] = print) -> Path:
    """Build the image from this checkout and write it as an OCI archive; its path."""
    archive = cache_root() / "image" / f"proxy-operator-{version()}.oci.tar"
    archive.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    say(f"building {DEFAULT_KUBERNETES_IMAGE} with scripts/build-image.sh")
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-image.sh"), "--oci-archive", str(archive)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )
    if result.returncode != 0:
        raise ImageBuildFailed(
            f"scripts/build-image.sh failed ({result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}"
        )
    say(f"image built in {time.monotonic() - started:.0f} s ({archive.stat().st_size >> 20} MiB archive)")
    return archive
