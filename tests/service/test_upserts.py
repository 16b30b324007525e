"""Upserts (service/sources/contract.py): a change's Proxies kept packed, read back as models."""

from __future__ import annotations

from service.sources.contract import SourceChange, Upserts
from stacks.models import PackedProxy, Proxy


def proxy(name: str, port: int = 3128) -> Proxy:
    return Proxy.model_validate(
        {
            "metadata": {"name": name, "namespace": "crawl"},
            "spec": {"provider": "local", "port": port, "allowedSourceRanges": ["127.0.0.0/8"]},
        }
    )


def test_what_goes_in_comes_back_equal_in_order() -> None:
    a, b = proxy("a"), proxy("b", 3129)
    upserts = Upserts([a])
    upserts.append(PackedProxy(b))
    assert list(upserts) == [a, b]
    assert upserts == [a, b]
    assert (upserts[0], upserts[-1], upserts[0:1]) == (a, b, [a])
    assert upserts.keys() == ["crawl/a", "crawl/b"]
    assert len(upserts) == 2
    assert upserts != [b, a]


def test_each_read_is_a_model_of_its_own() -> None:
    """The control loop may change what it reads (a deleting copy): the change itself does not change."""
    upserts = Upserts([proxy("a")])
    read = upserts[0]
    read.spec.port = 9999
    assert upserts[0].spec.port == 3128


def test_a_source_change_starts_empty_and_merges() -> None:
    merged, change = SourceChange(), SourceChange()
    assert merged.empty
    assert merged.upserts == []
    change.upserts.append(proxy("a"))
    merged.upserts += change.upserts
    assert not merged.empty
    assert merged.upserts.keys() == ["crawl/a"]
    assert merged.upserts.packed()[0] is change.upserts.packed()[0]  # shared, not packed again
