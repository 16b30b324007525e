"""The Proxy and catalogue models accept what they should and refuse the classic mistakes clearly."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from stacks.models import (
    KvmProvider,
    KvmProxySpec,
    LocalProxySpec,
    Protocol,
    ProviderCatalogue,
    Proxy,
    ProxySpec,
)


def proxy(**spec: Any) -> Proxy:
    body = {"provider": "local", **spec}
    return Proxy.model_validate({"metadata": {"name": "web-1", "namespace": "crawl"}, "spec": body})


def error_text(exc: pytest.ExceptionInfo[ValidationError]) -> str:
    return str(exc.value)


def test_defaults_and_key() -> None:
    made = proxy()
    assert made.key == "crawl/web-1"
    assert made.spec.port == 3128
    assert made.spec.protocol is Protocol.http
    assert made.spec.auth.mode == "generated"
    assert made.api_version == "crawl.example.com/v1alpha1"


def test_camel_case_on_the_wire_and_snake_case_in_python() -> None:
    made = proxy(allowedSourceRanges=["10.1.2.3/8", "192.0.2.7"], local={"bindAddress": "127.0.0.2"})
    assert made.spec.allowed_source_ranges == ["10.0.0.0/8", "192.0.2.7/32"]
    wire = made.model_dump(by_alias=True, mode="json")
    assert wire["spec"]["allowedSourceRanges"] == ["10.0.0.0/8", "192.0.2.7/32"]
    assert wire["spec"]["local"] == {"bindAddress": "127.0.0.2"}
    assert Proxy.model_validate(wire) == made


@pytest.mark.parametrize("port", [0, 65536, 70000])
def test_port_out_of_range(port: int) -> None:
    with pytest.raises(ValidationError, match="port"):
        proxy(port=port)


def test_unknown_field_is_refused() -> None:
    with pytest.raises(ValidationError, match="prot"):
        proxy(prot=3128)


@pytest.mark.parametrize("ranges", [[], ["0.0.0.0/0"], ["10.0.0.0/8", "::/0"], ["1.2.3.4/0"]])
def test_open_proxy_without_credentials_is_refused(ranges: list[str]) -> None:
    with pytest.raises(ValidationError, match="open proxies get abused") as exc:
        proxy(auth={"mode": "none"}, allowedSourceRanges=ranges)
    assert "allowed_source_ranges" in error_text(exc) or "allowedSourceRanges" in error_text(exc)


def test_proxy_without_credentials_on_narrow_ranges_is_fine() -> None:
    assert proxy(auth={"mode": "none"}, allowedSourceRanges=["10.1.0.0/16"]).spec.auth.mode == "none"


def test_open_ranges_with_credentials_are_fine() -> None:
    assert proxy(allowedSourceRanges=["0.0.0.0/0"]).spec.allowed_source_ranges == ["0.0.0.0/0"]


def test_bad_cidr_names_the_value() -> None:
    with pytest.raises(ValidationError, match=r"'10\.0\.0\.0/33' is not a CIDR"):
        proxy(allowedSourceRanges=["10.0.0.0/33"])


def test_secret_mode_needs_a_secret_ref() -> None:
    with pytest.raises(ValidationError, match=r"needs auth\.secretRef"):
        proxy(auth={"mode": "secret"})
    made = proxy(auth={"mode": "secret", "secretRef": {"name": "creds"}})
    assert made.spec.auth.secret_ref is not None
    assert made.spec.auth.secret_ref.name == "creds"


def test_secret_ref_without_secret_mode_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"only read when auth\.mode is 'secret'"):
        proxy(auth={"secretRef": {"name": "creds"}})


@pytest.mark.parametrize("name", ["Web", "web_1", "-web", "web-", "a" * 64, ""])
def test_names_are_dns1123_labels(name: str) -> None:
    with pytest.raises(ValidationError):
        proxy(provider=name)
    with pytest.raises(ValidationError):
        Proxy.model_validate({"metadata": {"name": name}, "spec": {"provider": "local"}})


def test_at_most_one_provider_block() -> None:
    with pytest.raises(ValidationError, match="at most one provider-type block, found gcp, local"):
        proxy(gcp={}, local={})


def test_block_for_gives_defaults_when_absent() -> None:
    spec = ProxySpec(provider="kvm-home", kvm=KvmProxySpec(host="h1", vcpus=2))
    assert spec.block_for("kvm").vcpus == 2
    assert spec.block_for("local") == LocalProxySpec()


def test_local_bind_address_must_be_an_ip() -> None:
    with pytest.raises(ValidationError, match="not an IP address"):
        proxy(local={"bindAddress": "localhost"})


def kvm_entry(**extra: Any) -> dict[str, Any]:
    host = {"name": "h1", "uri": "qemu+ssh://virt@kvm1.lan/system"}
    return {"type": "kvm", "name": "kvm-home", "hosts": [host], **extra}


def test_kvm_hosts_inherit_pool_and_network() -> None:
    entry = KvmProvider.model_validate(kvm_entry(pool="images"))
    assert entry.hosts[0].pool == "images"
    assert entry.hosts[0].network == "default"
    assert entry.host(None) is entry.hosts[0]
    assert entry.host("h1") is entry.hosts[0]
    assert entry.host("nope") is None


@pytest.mark.parametrize(
    "uri",
    [
        "qemu:///system",
        "qemu+ssh://kvm1.lan/system",
        "qemu+tcp://u@kvm1/system",
        "qemu+ssh://u@kvm1/",
        "qemu+ssh://u@kvm1/system?no_verify=1",
    ],
)
def test_kvm_uri_must_be_qemu_ssh_with_a_user(uri: str) -> None:
    body = kvm_entry()
    body["hosts"][0]["uri"] = uri
    with pytest.raises(ValidationError, match="uri"):
        KvmProvider.model_validate(body)


def test_kvm_host_names_unique() -> None:
    body = kvm_entry()
    body["hosts"].append(dict(body["hosts"][0]))
    with pytest.raises(ValidationError, match="repeated: h1"):
        KvmProvider.model_validate(body)


def test_catalogue_is_a_discriminated_union_with_unique_names() -> None:
    catalogue = ProviderCatalogue.model_validate(
        {"providers": [{"type": "local", "name": "local"}, kvm_entry()]}
    )
    assert catalogue.names() == ["local", "kvm-home"]
    assert catalogue.get("local").drift_policy == "detect"  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match=r"providers\[0\] and providers\[2\] are both named 'local'"):
        ProviderCatalogue.model_validate(
            {
                "providers": [
                    {"type": "local", "name": "local"},
                    kvm_entry(),
                    {"type": "local", "name": "local"},
                ]
            }
        )


def test_unknown_provider_type_is_refused() -> None:
    with pytest.raises(ValidationError, match="type"):
        ProviderCatalogue.model_validate({"providers": [{"type": "aws", "name": "x"}]})


def test_gcp_zone_must_be_in_region() -> None:
    body = {
        "type": "gcp",
        "name": "gcp-eu",
        "project": "crawl-prod",
        "region": "europe-west1",
        "zone": "europe-west4-a",
    }
    with pytest.raises(ValidationError, match="not in region"):
        ProviderCatalogue.model_validate({"providers": [body]})
