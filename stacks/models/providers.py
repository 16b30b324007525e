"""The provider catalogue: named instances of the types kubernetes, gcp, kvm and local."""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, PrivateAttr, field_validator, model_validator

from stacks.models.wire import DEFAULT_KVM_BASE_IMAGE, Dns1123Label, WireModel, ip_address_text


class ProviderBase(WireModel):
    name: Dns1123Label = Field(description="Unique name; Proxies select it with spec.provider.")
    drift_policy: Literal["correct", "detect"] = Field(
        default="detect",
        description="detect: report drift only; correct: refresh and up to restore the spec.",
    )


class KubernetesProvider(ProviderBase):
    type: Literal["kubernetes"]
    namespace: Dns1123Label = Field(default="proxies", description="Namespace the proxy Deployments run in.")
    kubeconfig_secret: Dns1123Label | None = Field(
        default=None, description="Secret with key `kubeconfig` for another cluster; absent = this cluster."
    )


class GcpProvider(ProviderBase):
    type: Literal["gcp"]
    project: str = Field(pattern=r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
    region: str = Field(pattern=r"^[a-z]+-[a-z]+[0-9]+$")
    zone: str = Field(pattern=r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
    network: str = "default"
    credentials_secret: Dns1123Label | None = Field(
        default=None,
        description="Secret with key `credentials.json` (service-account key); absent = ambient.",
    )

    @model_validator(mode="after")
    def _zone_in_region(self) -> GcpProvider:
        if not self.zone.startswith(f"{self.region}-"):
            raise ValueError(
                f"zone '{self.zone}' is not in region '{self.region}': pick a zone such as {self.region}-b"
            )
        return self


KVM_URI_SHAPE = "qemu+ssh://user@host[:port]/system"


class KvmHost(WireModel):
    name: Dns1123Label
    uri: str = Field(description=f"libvirt URI over SSH, {KVM_URI_SHAPE}.")
    pool: str | None = Field(default=None, description="Storage pool; defaults to the entry's pool.")
    network: str | None = Field(default=None, description="libvirt network; defaults to the entry's network.")

    @field_validator("uri")
    @classmethod
    def _qemu_ssh(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme != "qemu+ssh" or not parts.username or not parts.hostname:
            raise ValueError(f"'{value}' is not a libvirt URI over SSH: write it as {KVM_URI_SHAPE}")
        if parts.path not in ("/system", "/session"):
            raise ValueError(f"'{value}' must end in /system (or /session): write it as {KVM_URI_SHAPE}")
        if re.search(r"(^|&)no_verify=1", parts.query):
            raise ValueError("no_verify=1 skips the host key check: remove it and provide known_hosts")
        return value


class KvmProvider(ProviderBase):
    type: Literal["kvm"]
    hosts: list[KvmHost] = Field(min_length=1)
    pool: str = "default"
    network: str = "default"
    ssh_secret: Dns1123Label = Field(
        default="kvm-ssh", description="Secret with keys `id_ed25519` (private key) and `known_hosts`."
    )
    base_image: str = Field(
        default=DEFAULT_KVM_BASE_IMAGE, min_length=1, description="Cloud image URL or path."
    )
    domain_type: Literal["kvm", "qemu"] = Field(
        default="kvm",
        description="libvirt domain type: kvm (hardware virtualisation) or qemu (software emulation, TCG) "
        "for hosts whose /dev/kvm cannot run the guests.",
    )

    @model_validator(mode="after")
    def _unique_hosts_and_defaults(self) -> KvmProvider:
        names = [host.name for host in self.hosts]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"host names must be unique, repeated: {', '.join(duplicates)}: rename one")
        for host in self.hosts:  # fill inherited settings so readers see one value, and hashes agree
            host.pool = host.pool or self.pool
            host.network = host.network or self.network
        return self

    def host(self, name: str | None) -> KvmHost | None:
        """The named host, the first one when `name` is None, None when the catalogue lacks it."""
        if name is None:
            return self.hosts[0]
        return next((host for host in self.hosts if host.name == name), None)


PROCESS_MODELS = ("perProxy", "shared")
CHECKPOINTS = ("eachStep", "end")


class LocalProvider(ProviderBase):
    type: Literal["local"]
    bind_address: str = Field(
        default="127.0.0.1", description="Listen address for proxies without a `local` block."
    )
    state_dir: str | None = Field(
        default=None, description="Where process state and logs go; default a temp folder."
    )
    process_model: Literal["perProxy", "shared"] = Field(
        default="perProxy",
        description=(
            "perProxy: one forward proxy process per Proxy; shared: one listener process for every Proxy "
            "of this entry, each on its own port with its own settings (docs/providers.md)."
        ),
    )

    checkpoints: Literal["eachStep", "end"] = Field(
        default="eachStep",
        description=(
            "eachStep: the engine saves the stack's state after every resource step (its default); "
            "end: once, when an `up` ends (PULUMI_SKIP_CHECKPOINTS), for large shared entries: 500 "
            "proxies up in about 20 s instead of 5 minutes. Needs processModel: shared "
            "(docs/decisions.md, Checkpoints)."
        ),
    )

    @field_validator("bind_address")
    @classmethod
    def _ip_address(cls, value: str) -> str:
        return ip_address_text(value)

    @field_validator("checkpoints", mode="before")
    @classmethod
    def _known_checkpoints(cls, value: object) -> object:
        if value not in CHECKPOINTS:
            raise ValueError(
                f"checkpoints {value!r} is not a checkpoint mode: use eachStep (the state saved after every "
                "resource step, the default) or end (saved once when an up ends; processModel: shared only)"
            )
        return value

    @model_validator(mode="after")
    def _end_needs_shared(self) -> LocalProvider:
        if self.checkpoints == "end" and self.process_model != "shared":
            raise ValueError(
                "checkpoints: end needs processModel: shared (a proxy process each cannot take back a port "
                "that an interrupted up started without saving it): set processModel: shared, or remove "
                "checkpoints"
            )
        return self

    @field_validator("process_model", mode="before")
    @classmethod
    def _known_model(cls, value: object) -> object:
        if value not in PROCESS_MODELS:
            raise ValueError(
                f"processModel {value!r} is not a process model: use perProxy (one process per proxy, the "
                "default) or shared (one listener process serving every proxy of this entry on its own port)"
            )
        return value


ProviderEntry = Annotated[
    KubernetesProvider | GcpProvider | KvmProvider | LocalProvider, Field(discriminator="type")
]


class ProviderCatalogue(WireModel):
    providers: list[ProviderEntry] = Field(default_factory=list)
    _index: tuple[list[ProviderEntry], dict[str, ProviderEntry]] | None = PrivateAttr(default=None)

    @field_validator("providers")
    @classmethod
    def _unique_names(cls, value: list[ProviderEntry]) -> list[ProviderEntry]:
        message = duplicate_names_message([entry.name for entry in value])
        if message:
            raise ValueError(message)
        return value

    def get(self, name: str) -> ProviderEntry | None:
        """The entry named `name` (an index built at first use: the planner asks once per change, and a
        catalogue of 200 entries scanned each time made a change at scale cost more than the same change
        in a small fleet)."""
        indexed = self._index
        if indexed is None or indexed[0] is not self.providers or len(indexed[1]) != len(self.providers):
            indexed = self._index = (self.providers, {entry.name: entry for entry in self.providers})
        return indexed[1].get(name)

    def names(self) -> list[str]:
        return [entry.name for entry in self.providers]


def duplicate_names_message(names: list[object]) -> str | None:
    """The first repeated catalogue name with both positions (also run on documents that fail to parse)."""
    first: dict[object, int] = {}
    for index, name in enumerate(names):
        if name in first:
            return (
                f"providers[{first[name]}] and providers[{index}] are both named '{name}': names must be "
                "unique, rename one"
            )
        if isinstance(name, str):
            first[name] = index
    return None
