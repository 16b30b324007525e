"""The kvm program's disk volumes on libvirt-python: the base image of a (host, pool) and a proxy's
copy-on-write volume on it.

`LibvirtBaseVolume` uploads the catalogue's `baseImage` once into the pool (`libvirt_upload`). The rule of
the image cache: a base volume is never replaced or deleted while a proxy volume may back onto it (a proxy
forgotten with skip-cleanup may still run on it). So its provider never deletes: `delete` leaves the volume
in the pool (the program also marks it `retain_on_delete`, so the engine does not even ask), and a change of
`source` is no change at all (the program also sets `ignore_changes`): a new image behind the same URL never
rewrites the cache under running VMs. A base volume removed by hand is found by `read` and uploaded again.

`LibvirtVolume` is the proxy's own qcow2 overlay on the base volume's path, `sizeBytes` large. A change of
its size or base replaces it (the domain on it is replaced with it: `libvirt_domain` replaces on `diskSize`).
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider, UpdateResult

from stacks.programs import dynamic_pickling
from stacks.programs.libvirt_conn import connected
from stacks.programs.libvirt_resource import compare, find_pool, find_volume, read_volume
from stacks.programs.libvirt_upload import local_copy, upload_new, volume_xml

VOLUME_OUTPUTS = ("path",)


def _lookup(conn: Any, props: dict[str, Any]) -> Any | None:
    return find_volume(conn, pool=props["pool"], name=props["name"])


def _read(id_: str, props: dict[str, Any]) -> ReadResult:
    with connected(props["uri"], props["sshDir"]) as conn:
        return read_volume(id_, props, conn)


def _leftover(props: dict[str, Any]) -> str:
    """Never reused nor overwritten: it may be a cut-short upload, or a cache that VMs back onto."""
    name, pool = props["name"], props["pool"]
    return (
        f"a volume {name} is already in pool {pool} on {props['uri']}: left by an interrupted create, or a "
        "base image the state lost. If no volume backs onto it (`qemu-img info --backing-chain` on the "
        f"host's px-*.qcow2), delete it (`virsh vol-delete {name} --pool {pool}`) and run up again"
    )


class BaseVolumeProvider(ResourceProvider):
    """Uploads once; never rewrites nor deletes (the cache rule above)."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        with connected(props["uri"], props["sshDir"]) as conn:
            if _lookup(conn, props) is not None:
                raise RuntimeError(_leftover(props))
            with local_copy(props["source"]) as path:
                volume = upload_new(conn, find_pool(conn, props["pool"]), name=props["name"], path=path)
            return CreateResult(id_=volume.key(), outs={**props, "path": volume.path()})

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return _read(id_, props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return compare(olds, news, replace_on=("pool", "name"), ignore=("source", *VOLUME_OUTPUTS))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs={**news, "source": olds.get("source"), "path": olds.get("path")})

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        """Leaves the volume in the pool: a VM the stack no longer holds may still back onto it."""


class ProxyVolumeProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        with connected(props["uri"], props["sshDir"]) as conn:
            pool = find_pool(conn, props["pool"])
            xml = volume_xml(
                name=props["name"], capacity=int(props["sizeBytes"]), fmt="qcow2", backing=props["basePath"]
            )
            volume = pool.createXML(xml, 0)
            return CreateResult(id_=volume.key(), outs={**props, "path": volume.path()})

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return _read(id_, props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return compare(
            olds, news, replace_on=("pool", "name", "basePath", "sizeBytes"), ignore=VOLUME_OUTPUTS
        )

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs={**news, "path": olds.get("path")})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        with connected(props["uri"], props["sshDir"]) as conn:
            volume = _lookup(conn, props)
            if volume is not None:
                volume.delete(0)


class LibvirtBaseVolume(Resource, module="proxy-operator", name="LibvirtBaseVolume"):
    """The cached base image of one (host, pool); `path` is what proxy volumes back onto."""

    path: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        *,
        uri: str,
        ssh_dir: str,
        pool: str,
        volume_name: pulumi.Input[str],
        source: str,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "uri": uri,
            "sshDir": ssh_dir,
            "pool": pool,
            "name": volume_name,
            "source": source,
            "path": None,
        }
        super().__init__(BaseVolumeProvider(), name, props, opts)
        dynamic_pickling.unstack()


class LibvirtVolume(Resource, module="proxy-operator", name="LibvirtVolume"):
    """A proxy's qcow2 overlay on `base_path`."""

    path: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        *,
        uri: str,
        ssh_dir: str,
        pool: str,
        volume_name: str,
        base_path: pulumi.Input[str],
        size_bytes: int,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "uri": uri,
            "sshDir": ssh_dir,
            "pool": pool,
            "name": volume_name,
            "basePath": base_path,
            "sizeBytes": size_bytes,
            "path": None,
        }
        super().__init__(ProxyVolumeProvider(), name, props, opts)
        dynamic_pickling.unstack()
