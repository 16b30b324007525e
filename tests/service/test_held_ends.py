"""service/discovery/held_ends.py: the (client, proxy) -> latest end map answers as a plain dict would,
while its clients move between dicts and arrays and its slots are freed and reused."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from service.discovery.held_ends import HeldEnds

CLIENTS = ["a", "b", "c"]
PROXIES = [f"ns/p{i}" for i in range(12)]
KEEP = 10.0

step = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(CLIENTS), st.sampled_from(PROXIES), st.floats(0, 30)),
    st.tuples(st.just("sweep"), st.just(""), st.just(""), st.floats(0, 20)),
)


@settings(max_examples=400, deadline=None)
@given(steps=st.lists(step, max_size=80), dense_min=st.integers(1, 4))
def test_it_answers_as_a_dict_of_pairs(steps: list[tuple[str, str, str, float]], dense_min: int) -> None:
    ends, model, now = HeldEnds(dense_min=dense_min), {}, 0.0
    for kind, client, proxy, value in steps:
        if kind == "put":
            until = now + value
            ends.put(client, proxy, until)
            model[(client, proxy)] = max(model.get((client, proxy), until), until)
        else:
            now += value
            ends.sweep(now=now, keep=KEEP)
            model = {pair: end for pair, end in model.items() if end + KEEP > now}
        assert {(c, p): ends.get(c, p) for c in CLIENTS for p in PROXIES} == {
            (c, p): model.get((c, p)) for c in CLIENTS for p in PROXIES
        }
        assert ends.pairs() == len(model)


def test_a_client_over_many_proxies_keeps_an_array_and_goes_back_to_a_dict() -> None:
    """The two forms and the slots' reuse, by their effect on what is kept (an array is 8 bytes a slot)."""
    ends = HeldEnds(dense_min=4)
    for i in range(9):
        ends.put("a", f"ns/p{i}", 100.0 + i)
    assert "a" in ends._dense
    assert not ends._sparse
    assert [ends.get("a", f"ns/p{i}") for i in range(9)] == [100.0 + i for i in range(9)]
    ends.put("b", "ns/p0", 50.0)  # few: a dict
    assert "b" in ends._sparse
    ends.sweep(now=107.5, keep=0.0)  # a's ends up to 107 go: one left of 9 slots, back to a dict
    assert ends._sparse["a"] == {"ns/p8": 108.0}
    assert not ends._dense
    assert set(ends._slot) == {"ns/p8"}  # the others' slots freed; its own kept for one more sweep
    ends.sweep(now=107.5, keep=0.0)
    assert not ends._slot
    assert not ends._proxies  # free slots at the end are dropped, not kept at their peak
    assert ends.get("b", "ns/p0") is None
    assert ends.pairs() == 1
