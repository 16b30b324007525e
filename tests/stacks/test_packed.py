"""PackedProxy (stacks/models/packed.py): the compact copy of a Proxy gives back an equal model."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from stacks.models import PackedProxy, Proxy
from tests.stacks.test_crd import example_proxies

EXAMPLES = example_proxies()
LABEL_TEXT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._/", min_size=1, max_size=20)


@st.composite
def proxy_documents(draw: st.DrawFn) -> dict[str, Any]:
    """An example manifest with drawn metadata: labels, annotations (any text), a generation, and a
    deletion timestamp in any time zone down to the microsecond."""
    document = copy.deepcopy(draw(st.sampled_from(EXAMPLES)))
    meta = document["metadata"]
    meta["labels"] = draw(st.dictionaries(LABEL_TEXT, st.text(max_size=20), max_size=3))
    meta["annotations"] = draw(st.dictionaries(LABEL_TEXT, st.text(max_size=40), max_size=3))
    meta["generation"] = draw(st.integers(1, 2**40))
    if draw(st.booleans()):
        moment = draw(st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)))
        offset = timezone(timedelta(minutes=draw(st.integers(-14 * 60, 14 * 60))))
        meta["deletionTimestamp"] = moment.replace(tzinfo=offset).isoformat()
    return document


@given(document=proxy_documents())
def test_the_packed_copy_gives_back_an_equal_model(document: dict[str, Any]) -> None:
    proxy = Proxy.model_validate(document)
    packed = PackedProxy(proxy)
    assert packed.proxy == proxy
    assert packed.proxy.model_dump(by_alias=True) == proxy.model_dump(by_alias=True)
    assert (packed.key, packed.provider) == (proxy.key, proxy.spec.provider)
    assert packed.deleting == (proxy.metadata.deletion_timestamp is not None)
    assert packed.flat_name == f"{proxy.metadata.namespace}-{proxy.metadata.name}"


def test_each_access_is_a_copy_of_its_own() -> None:
    """A caller may change the model it got: the packed version does not change."""
    packed = PackedProxy(Proxy.model_validate(EXAMPLES[0]))
    changed = packed.proxy
    changed.metadata.deletion_timestamp = datetime.now(UTC)
    changed.metadata.labels["edited"] = "yes"
    assert packed.proxy.metadata.deletion_timestamp is None
    assert "edited" not in packed.proxy.metadata.labels
    assert not packed.deleting
    assert PackedProxy(changed).deleting
    assert PackedProxy(changed) != packed
