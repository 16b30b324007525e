"""The guest images the tests boot: `scripts/build-kvm-image.sh` (cached outside the clone, keyed by the
recipe), built on first use and then found in seconds. A failed build is `ImageUnavailable` with its log."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "build-kvm-image.sh"
BUILD_TIMEOUT = 1200


class ImageUnavailable(RuntimeError):
    """The image could not be built; the message has the end of the build's output."""


@dataclass(frozen=True)
class GuestImage:
    variant: str  # "fast" (the tests' own init) or "full" (systemd, what users build)
    path: Path
    seconds: float  # how long the build (or the cache look-up) took
    reused: bool


def guest_image(variant: str, *, log: Path) -> GuestImage:
    started = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(
            ["bash", str(SCRIPT), variant], stdout=subprocess.PIPE, stderr=out, text=True,
            timeout=BUILD_TIMEOUT, check=False,
        )  # fmt: skip
    seconds = time.monotonic() - started
    said = log.read_text(errors="replace")
    if done.returncode != 0 or not done.stdout.strip():
        tail = "\n".join(said.splitlines()[-20:])
        raise ImageUnavailable(f"`{SCRIPT.name} {variant}` failed ({done.returncode}), log {log}:\n{tail}")
    path = Path(done.stdout.strip().splitlines()[-1])
    reused = f"reusing the {variant} image" in said
    return GuestImage(variant=variant, path=path, seconds=seconds, reused=reused)
