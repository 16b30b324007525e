"""The proxy's NoCloud cloud-init disk on libvirt-python: an ISO 9660 volume labelled `cidata` holding
`user-data`, `meta-data` and, when given, `network-config`, uploaded into the host's pool.

The ISO is written by `genisoimage` (or `mkisofs`, or `xorriso -as mkisofs`) where the program runs, with
Joliet and Rock Ridge names, as cloud-init's NoCloud source reads it (what terraform-provider-libvirt did
with `mkisofs`); pycdlib would do it in Python but is one more dependency for three small files. It never
holds credentials: the pool is readable by the host's libvirt users (`kvm_credentials` delivers them).

Any content change replaces the disk (the program names it after a hash of its user-data, so old and new
live side by side while the domain is replaced); the disk is deleted with its resource.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider, UpdateResult

from stacks.programs import dynamic_pickling
from stacks.programs.libvirt_conn import connected
from stacks.programs.libvirt_resource import compare, find_pool, find_volume, read_volume
from stacks.programs.libvirt_upload import upload_new

VOLUME_ID = "cidata"
ISO_TOOLS = (("genisoimage",), ("mkisofs",), ("xorriso", "-as", "mkisofs"))
CONTENT = {"userData": "user-data", "metaData": "meta-data", "networkConfig": "network-config"}


def iso_tool() -> list[str]:
    for argv in ISO_TOOLS:
        if shutil.which(argv[0]):
            return list(argv)
    raise RuntimeError(
        "the kvm program writes the cloud-init ISO with genisoimage, mkisofs or xorriso and found none: "
        "install genisoimage where the service runs (Debian package genisoimage)"
    )


def write_iso(files: dict[str, str], target: Path) -> Path:
    """An ISO 9660 image at `target`, volume id `cidata`, holding `files` (name -> text)."""
    folder = target.parent / "cidata"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    argv = [*iso_tool(), "-quiet", "-output", str(target), "-volid", VOLUME_ID, "-joliet", "-rock"]
    done = subprocess.run([*argv, *sorted(str(p) for p in folder.iterdir())], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} could not write the cloud-init ISO: {done.stderr.strip()[-500:]}")
    return target


def cidata_files(props: dict[str, Any]) -> dict[str, str]:
    return {file: props[key] for key, file in CONTENT.items() if props.get(key) is not None}


class CloudInitDiskProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        with connected(props["uri"], props["sshDir"]) as conn, tempfile.TemporaryDirectory() as folder:
            iso = write_iso(cidata_files(props), Path(folder) / "cidata.iso")
            volume = upload_new(conn, find_pool(conn, props["pool"]), name=props["name"], path=iso)
            return CreateResult(id_=volume.key(), outs={**props, "path": volume.path()})

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        with connected(props["uri"], props["sshDir"]) as conn:
            return read_volume(id_, props, conn)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # A new name lets the new disk be made before the old goes; the same name cannot.
        same_name = olds.get("name") == news.get("name")
        return compare(
            olds, news, replace_on=("pool", "name", *CONTENT), ignore=("path",), delete_first=same_name
        )

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs={**news, "path": olds.get("path")})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        with connected(props["uri"], props["sshDir"]) as conn:
            volume = find_volume(conn, pool=props["pool"], name=props["name"])
            if volume is not None:
                volume.delete(0)


class LibvirtCloudInitDisk(Resource, module="proxy-operator", name="LibvirtCloudInitDisk"):
    """The cidata ISO volume; `path` is what the domain's cd-rom reads."""

    path: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        *,
        uri: str,
        ssh_dir: str,
        pool: str,
        volume_name: pulumi.Input[str],
        user_data: pulumi.Input[str],
        meta_data: pulumi.Input[str],
        network_config: pulumi.Input[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "uri": uri,
            "sshDir": ssh_dir,
            "pool": pool,
            "name": volume_name,
            "userData": user_data,
            "metaData": meta_data,
            "networkConfig": network_config,
            "path": None,
        }
        super().__init__(CloudInitDiskProvider(), name, props, opts)
        dynamic_pickling.unstack()
