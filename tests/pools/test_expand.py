"""The shape of a pool: spread by placement, child names within the physical budget, the template."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.pools.expand import child_port, child_proxy, spread
from service.pools.naming import BORN_LABEL, POOL_LABEL, REPLACES_LABEL, child_name, member_of
from stacks.models import PoolPlacement, ProxyPool
from tests.pools.pools import pool, pool_doc


def places(*items: dict[str, object]) -> list[PoolPlacement]:
    return [PoolPlacement.model_validate(i) for i in items]


def test_spread_equal_weights_3_and_3() -> None:
    assert spread(places({"provider": "a"}, {"provider": "b"}), 6) == {"a": 3, "b": 3}


def test_spread_odd_count_goes_to_the_first_listed() -> None:
    assert spread(places({"provider": "a"}, {"provider": "b"}), 7) == {"a": 4, "b": 3}


def test_spread_fixed_count_first_then_weights() -> None:
    got = spread(places({"provider": "a", "count": 2}, {"provider": "b", "weight": 3}, {"provider": "c"}), 10)
    assert got == {"a": 2, "b": 6, "c": 2}


def test_spread_never_below_fixed_counts() -> None:
    assert spread(places({"provider": "a", "count": 4}, {"provider": "b"}), 2) == {"a": 4, "b": 0}


def test_child_name_fits_the_physical_budget() -> None:
    name = child_name(pool="p" * 63, namespace="n" * 20, token="abcde")
    assert name.endswith("-abcde")
    assert len(f"px-{'n' * 20}-{name}") <= 60


def test_child_carries_pool_labels_and_template() -> None:
    p = pool(template_spec={"protocol": "socks5"})
    child = child_proxy(
        p, p.spec.placement[1], name="eu-x1y2z", born=1700000000.9, port=4000, replaces="eu-old"
    )
    assert child.spec.provider == "b"
    assert child.spec.port == 4000
    assert child.spec.protocol == "socks5"
    assert child.spec.pool == "eu"  # discovery's pool filter selects the pool's children
    assert child.metadata.labels[POOL_LABEL] == "eu"
    assert child.metadata.labels[BORN_LABEL] == "1700000000"
    assert child.metadata.labels[REPLACES_LABEL] == "eu-old"
    again = member_of(child)
    assert again is not None
    assert again.born == 1700000000
    assert again.replaces == "eu-old"
    assert again.placement == "b"
    assert again.pool == "crawl/eu"


def test_local_children_take_the_first_free_port() -> None:
    p = pool(placement=[{"provider": "a", "portBase": 4000}])
    assert child_port(p, p.spec.placement[0], used={4000, 4001, 4003}) == 4002


def test_template_may_not_name_a_provider() -> None:
    with pytest.raises(ValidationError, match="names no provider"):
        ProxyPool.model_validate(pool_doc(template_spec={"provider": "a"}))


def test_weight_and_count_together_refused() -> None:
    with pytest.raises(ValidationError, match="weight or count"):
        pool(placement=[{"provider": "a", "weight": 1, "count": 2}])


def test_min_above_max_refused() -> None:
    with pytest.raises(ValidationError, match="exceeds maxReplicas"):
        pool(minReplicas=5, maxReplicas=3)


def test_max_unavailable_percent() -> None:
    assert pool(replicas=10, rotation={"maxUnavailable": "25%"}).spec.max_unavailable_count() == 2
    assert pool(replicas=2, rotation={"maxUnavailable": "10%"}).spec.max_unavailable_count() == 1
