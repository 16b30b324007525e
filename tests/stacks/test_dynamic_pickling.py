"""The SDK's provider serialization stacks one wrapper per dynamic resource (dynamic_pickling.py): past
about 1,000 resources a program fails with RecursionError. With `unstack` after each, it never deepens."""

from __future__ import annotations

import pickle

from pulumi.dynamic.dynamic import serialize_provider

from stacks.programs import dynamic_pickling
from stacks.programs.local_shared import LocalSharedProxyProvider


def test_serializing_many_providers_stays_shallow_with_unstack() -> None:
    provider = LocalSharedProxyProvider()
    first = serialize_provider(provider)
    dynamic_pickling.unstack()
    for _ in range(2000):  # past the recursion limit (1,000) without unstack
        assert serialize_provider(provider) == first  # deterministic, as the SDK wants
        dynamic_pickling.unstack()
    assert pickle._Pickler._batch_setitems is dynamic_pickling.ORIGINAL  # type: ignore[attr-defined]
