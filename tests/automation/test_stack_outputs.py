"""The reconciler's store of each stack's last outputs (kept deflated, automation/stack_outputs.py)."""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from automation.stack_outputs import StackOutputs

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(), json_values, max_size=6))
def test_what_is_put_is_what_is_read(outputs: dict[str, object]) -> None:
    store = StackOutputs()
    store.put("run-01", outputs)
    assert store.get("run-01") == outputs
    assert store.names("run-01") == tuple(sorted(outputs))
    assert "run-01" in store


def test_each_read_is_a_copy_of_its_own() -> None:
    store = StackOutputs()
    password = "é\ud800"  # not ASCII, and a lone surrogate (JSON's `\ud800` decodes to one)
    store.put(
        "s", {"proxies": {"crawl/p1": {"port": 8001}}, "credentials": {"crawl/p1": {"password": password}}}
    )
    read = store.get("s")
    read["proxies"]["crawl/p1"]["port"] = 1
    assert store.get("s")["proxies"]["crawl/p1"]["port"] == 8001
    assert store.get("s")["credentials"]["crawl/p1"]["password"] == password


def test_an_unknown_or_removed_stack_has_no_outputs() -> None:
    store = StackOutputs()
    assert store.get("nope") == {}
    store.put("s", {"specHash": "x"})
    assert store.names("s") == ("specHash",)
    store.pop("s")
    store.pop("s")
    assert store.get("s") == {}
    assert store.names("s") == ()
    assert "s" not in store


def test_a_reader_can_keep_only_the_outputs_it_names() -> None:
    store = StackOutputs()
    store.put("s", {"appliedProxies": [{"name": "p1"}], "proxies": {"crawl/p1": {}}, "credentials": {}})
    assert store.get("s", ("proxies", "credentials", "specHash")) == {
        "proxies": {"crawl/p1": {}},
        "credentials": {},
    }
    assert store.get("nope", ("proxies",)) == {}
    assert store.read("s", lambda outputs: sorted(outputs)) == ["appliedProxies", "credentials", "proxies"]


def test_outputs_are_decoded_one_stack_at_a_time() -> None:
    """The queue's workers decode in threads: four stacks' outputs at once, each held while its report went
    on, raised a leader's RSS for good (bench_leader_state's resync). A second read waits for the first's
    `use` to return."""
    store = StackOutputs()
    store.put("a", {"proxies": {"crawl/a": {}}})
    store.put("b", {"proxies": {"crawl/b": {}}})
    inside, release = threading.Event(), threading.Event()
    order: list[str] = []

    def hold(outputs: dict[str, object]) -> None:
        order.append("a in")
        inside.set()
        assert release.wait(10)
        order.append("a out")

    first = threading.Thread(target=store.read, args=("a", hold))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=lambda: order.append(f"b {sorted(store.get('b'))}"))
    second.start()
    second.join(0.3)
    assert second.is_alive(), "the second decode did not wait for the first"
    release.set()
    first.join(10)
    second.join(10)
    assert order == ["a in", "a out", "b ['proxies']"]
