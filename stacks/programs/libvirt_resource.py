"""What the kvm program's libvirt dynamic providers share: where a resource lives, how it compares, and how
`read` reports one that is gone.

Every resource's inputs carry `uri` (the catalogue's host URI: the resource's host) and `sshDir` (where the
key and known_hosts are mounted: how to reach the host, not part of what the resource is). A change of
`uri` or of any of the resource's `REPLACE_ON` keys replaces it; a change of `sshDir` alone is an update
that only moves it in state.

`read` returning `gone()` drops the resource from state on `refresh`, so the next `up` makes it again: how
a VM or a volume removed by hand is found (drift).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pulumi.dynamic import DiffResult, ReadResult

from stacks.programs.libvirt_conn import is_missing

HOST_KEYS = ("uri",)
REACH_KEYS = ("sshDir",)
VOLUME_MISSING = ("VIR_ERR_NO_STORAGE_VOL", "VIR_ERR_NO_STORAGE_POOL")


def compare(
    olds: dict[str, Any],
    news: dict[str, Any],
    *,
    replace_on: Iterable[str],
    ignore: Iterable[str] = (),
    delete_first: bool = True,
) -> DiffResult:
    """Replace on a change of the host or of `replace_on`; any other input change (not `ignore`) updates."""
    skipped = set(ignore)
    replaces = [
        key for key in (*HOST_KEYS, *replace_on) if key not in skipped and olds.get(key) != news.get(key)
    ]
    changed = [key for key in news if key not in skipped and olds.get(key) != news.get(key)]
    return DiffResult(changes=bool(changed), replaces=replaces, delete_before_replace=delete_first)


def gone() -> ReadResult:
    """`read`'s answer for a resource that no longer exists on its host."""
    return ReadResult(id_="", outs={})


def find_pool(conn: Any, name: str) -> Any:
    """The storage pool `name`, refreshed so files removed behind libvirt's back are seen as gone. libvirt
    refuses a refresh while a volume of the pool is being uploaded ("has asynchronous jobs running": another
    proxy's disk or image, made at the same time); the pool is then used as libvirt knows it."""
    pool = conn.storagePoolLookupByName(name)
    if pool.isActive():
        try:
            pool.refresh(0)
        except Exception as exc:
            if "asynchronous jobs running" not in str(exc):
                raise
    return pool


def find_volume(conn: Any, *, pool: str, name: str) -> Any | None:
    """The volume `name` of `pool`, None when it (or its pool) is gone."""
    try:
        return find_pool(conn, pool).storageVolLookupByName(name)
    except Exception as exc:
        if is_missing(exc, *VOLUME_MISSING):
            return None
        raise


def read_volume(id_: str, props: dict[str, Any], conn: Any) -> ReadResult:
    """`read` of a volume resource (inputs `pool`, `name`; output `path`)."""
    volume = find_volume(conn, pool=props["pool"], name=props["name"])
    if volume is None:
        return gone()
    return ReadResult(id_=id_, outs={**props, "path": volume.path()})
