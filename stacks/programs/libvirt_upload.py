"""Putting a local file into a new libvirt volume: the base image (`libvirt_volumes`) and the cidata ISO
(`libvirt_cidata`) go up through a libvirt stream on the program's own connection (over SSH for a remote
host), so the host needs nothing but libvirtd.

The catalogue's `baseImage` is a path on the machine that runs the program or an http(s) URL, fetched to a
temporary file first. A qcow2 volume is made with the image's virtual size (read from the qcow2 header:
bytes 24-31, big-endian), so a copy-on-write volume on it sees the whole disk.
"""

from __future__ import annotations

import contextlib
import shutil
import struct
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

QCOW2_MAGIC = b"QFI\xfb"
CHUNK = 1024 * 1024
DOWNLOAD_TIMEOUT = 60


def image_format(path: Path) -> tuple[str, int]:
    """("qcow2", virtual size) for a qcow2 file, else ("raw", its size)."""
    with path.open("rb") as image:
        header = image.read(32)
    if len(header) == 32 and header[:4] == QCOW2_MAGIC:
        return "qcow2", int(struct.unpack(">Q", header[24:32])[0])
    return "raw", path.stat().st_size


@contextmanager
def local_copy(source: str) -> Iterator[Path]:
    """The image as a local file: a path as it is, an http(s) URL downloaded to a temporary file."""
    scheme = urlsplit(source).scheme
    if scheme in ("", "file"):
        path = Path(urlsplit(source).path if scheme == "file" else source)
        if not path.is_file():
            raise FileNotFoundError(f"the base image {source} is not a file where the program runs")
        yield path
        return
    if scheme not in ("http", "https"):
        raise ValueError(f"the base image {source} is neither a path nor an http(s) URL")
    with tempfile.TemporaryDirectory(prefix="proxy-operator-image-") as folder:
        target = Path(folder) / "image"
        with urllib.request.urlopen(source, timeout=DOWNLOAD_TIMEOUT) as answer, target.open("wb") as out:
            shutil.copyfileobj(answer, out, CHUNK)
        yield target


def volume_xml(*, name: str, capacity: int, fmt: str, backing: str | None = None) -> str:
    store = (
        f"<backingStore><path>{escape(backing)}</path><format type='qcow2'/></backingStore>"
        if backing
        else ""
    )
    return (
        f"<volume><name>{escape(name)}</name><capacity unit='bytes'>{capacity}</capacity>"
        f"<target><format type='{fmt}'/></target>{store}</volume>"
    )


def upload_new(conn: Any, pool: Any, *, name: str, path: Path) -> Any:
    """A new volume `name` in `pool` holding the file's bytes; removed again if the upload fails."""
    fmt, capacity = image_format(path)
    volume = pool.createXML(volume_xml(name=name, capacity=capacity, fmt=fmt), 0)
    stream = conn.newStream(0)
    try:
        volume.upload(stream, 0, path.stat().st_size, 0)
        with path.open("rb") as source:
            stream.sendAll(lambda _stream, nbytes, handle: handle.read(min(nbytes, CHUNK)), source)
        stream.finish()
    except BaseException:
        _abort(stream)
        volume.delete(0)
        raise
    return volume


def _abort(stream: Any) -> None:
    # Already finished or broken: the volume's removal is what matters.
    with contextlib.suppress(Exception):
        stream.abort()
