"""The Dockerfile's download stage: the official Pulumi CLI and provider plugins into one folder.

Reads PULUMI_VERSION, PLUGINS (Pulumi package names, e.g. "kubernetes gcp") with PULUMI_<NAME>_VERSION for
each, and TARGETARCH (amd64 or arm64; default amd64). Only `pulumi` is taken from the CLI bundle: the Python
language host and the dynamic-provider launcher are the package's own console scripts.
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
import urllib.request
from pathlib import Path

RELEASES = "https://get.pulumi.com/releases"


def fetch(url: str, member: str, target: Path) -> None:
    print("downloading", url, flush=True)
    with urllib.request.urlopen(url, timeout=300) as answer:
        data = answer.read()
    with tarfile.open(fileobj=io.BytesIO(data)) as bundle:
        source = bundle.extractfile(member)
        if source is None:
            raise SystemExit(f"{url} holds no file {member}")
        target.write_bytes(source.read())
    target.chmod(0o755)


def main(out: Path) -> None:
    arch = os.environ.get("TARGETARCH") or "amd64"
    cli_arch = {"amd64": "x64", "arm64": "arm64"}[arch]
    out.mkdir(parents=True, exist_ok=True)
    version = os.environ["PULUMI_VERSION"]
    fetch(f"{RELEASES}/sdk/pulumi-v{version}-linux-{cli_arch}.tar.gz", "pulumi/pulumi", out / "pulumi")
    for plugin in os.environ.get("PLUGINS", "").split():
        name = f"pulumi-resource-{plugin}"
        version = os.environ[f"PULUMI_{plugin.upper()}_VERSION"]
        fetch(f"{RELEASES}/plugins/{name}-v{version}-linux-{arch}.tar.gz", name, out / name)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
