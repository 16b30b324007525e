"""The spec hash moves with what decides resources and with nothing else."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from stacks.models import LocalProvider, Proxy
from stacks.spec_hash import (
    canonical_json,
    proxy_hash_fragment,
    proxy_spec_hash,
    sha256_hex,
    stack_spec_hash,
)


def make(spec: dict[str, Any] | None = None, **metadata: Any) -> Proxy:
    body = {"provider": "local", "port": 18081, "allowedSourceRanges": ["10.0.0.0/8"]} | (spec or {})
    meta = {"name": "web-1", "namespace": "crawl"} | metadata
    return Proxy.model_validate({"metadata": meta, "spec": body})


def test_is_a_sha256_hex_digest() -> None:
    digest = proxy_spec_hash(make())
    assert len(digest) == 64
    assert int(digest, 16) >= 0


def test_key_order_does_not_matter() -> None:
    forward = {
        "provider": "local",
        "port": 18081,
        "auth": {"mode": "generated"},
        "local": {"bindAddress": "::1"},
    }
    backward = dict(reversed(list(forward.items())))
    assert list(backward) != list(forward)
    assert proxy_spec_hash(make(forward)) == proxy_spec_hash(make(backward))


def test_explicit_defaults_do_not_change_it() -> None:
    explicit = {"protocol": "http", "auth": {"mode": "generated"}, "kvm": None}
    assert proxy_spec_hash(make(explicit)) == proxy_spec_hash(make())


def test_equivalent_cidr_spellings_hash_alike() -> None:
    assert proxy_spec_hash(make({"allowedSourceRanges": ["10.9.9.9/8"]})) == proxy_spec_hash(make())


def test_status_labels_annotations_and_pool_do_not_change_it() -> None:
    base = proxy_spec_hash(make())
    assert proxy_spec_hash(make(labels={"team": "search"}, annotations={"note": "x"}, generation=7)) == base
    assert proxy_spec_hash(make({"pool": "eu"})) == base
    with_status = make()
    with_status.status.phase = "Ready"
    with_status.status.observed_spec_hash = base
    assert proxy_spec_hash(with_status) == base


def test_what_shapes_resources_changes_it() -> None:
    base = proxy_spec_hash(make())
    changed = [
        make({"port": 18082}),
        make({"protocol": "socks5"}),
        make({"allowedSourceRanges": ["10.0.0.0/9"]}),
        make({"local": {"bindAddress": "127.0.0.2"}}),
        make(name="web-2"),
        make(namespace="other"),
    ]
    hashes = {proxy_spec_hash(proxy) for proxy in changed}
    assert base not in hashes
    assert len(hashes) == len(changed)


def test_stack_hash_combines_proxies_and_catalogue_entry() -> None:
    entry = LocalProvider(type="local", name="local")
    hashes = {"crawl/a": proxy_spec_hash(make(name="a")), "crawl/b": proxy_spec_hash(make(name="b"))}
    base = stack_spec_hash(entry, hashes)
    assert stack_spec_hash(entry, dict(reversed(list(hashes.items())))) == base
    assert stack_spec_hash(entry, {"crawl/a": hashes["crawl/a"]}) != base
    assert stack_spec_hash(entry, hashes | {"crawl/b": proxy_spec_hash(make({"port": 1}, name="b"))}) != base
    assert stack_spec_hash(LocalProvider(type="local", name="local", drift_policy="correct"), hashes) != base
    assert (
        stack_spec_hash(LocalProvider(type="local", name="local", bind_address="127.0.0.2"), hashes) != base
    )
    assert stack_spec_hash(LocalProvider(type="local", name="local", drift_policy="detect"), hashes) == base


@given(
    st.dictionaries(st.text(min_size=1, max_size=12), st.text(alphabet="0123456789abcdef", max_size=64)),
    st.sampled_from(["127.0.0.1", "::1"]),
)
def test_the_stack_hash_from_its_parts_is_the_hash_of_the_whole_document(
    hashes: dict[str, str], bind: str
) -> None:
    """The planner hashes a stack from per-proxy items it keeps; the hash must stay the one every stack
    applied before (SHA-256 of the canonical JSON document), or an upgrade would run every stack's `up`."""
    entry = LocalProvider(type="local", name="local", bind_address=bind)
    document = {
        "provider": entry.model_dump(by_alias=True, mode="json"),
        "proxies": [[key, hashes[key]] for key in sorted(hashes)],
    }
    assert stack_spec_hash(entry, hashes) == sha256_hex(document)


@given(key=st.text(), proxy_hash=st.text())
def test_a_proxy_s_fragment_is_its_canonical_json_whatever_the_text(key: str, proxy_hash: str) -> None:
    """The planner's fragments are put together without the JSON encoder when nothing needs escaping;
    the stack hash must stay what it was (a different text would run every stack's `up` once)."""
    assert proxy_hash_fragment(key, proxy_hash) == canonical_json([key, proxy_hash])


def test_a_fragment_with_a_character_to_escape_is_escaped() -> None:
    for key in ['a"b', "a\\b", "a\x01b", "a\nb"]:
        assert proxy_hash_fragment(key, "00") == canonical_json([key, "00"])
        assert proxy_hash_fragment("ns/a", key) == canonical_json(["ns/a", key])
