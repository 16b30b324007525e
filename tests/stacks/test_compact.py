"""stacks/compact.py: text deflated with a shared dictionary gives back the same bytes, and the same text
always packs to the same bytes (packed copies are compared for equality: the board, PackedProxy)."""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacks.compact import PROXY_PACKER, STATUS_PACKER, Packer
from stacks.models import ProxyStatus

PACKERS = [STATUS_PACKER, PROXY_PACKER, Packer(b"")]

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


@pytest.mark.parametrize("packer", PACKERS, ids=["status", "proxy", "no-dictionary"])
@given(text=st.binary(max_size=2000))
def test_any_bytes_come_back_as_they_were(packer: Packer, text: bytes) -> None:
    packed = packer.pack(text)
    assert packer.unpack(packed) == text
    assert packer.pack(text) == packed  # the same text, the same bytes


@given(document=JSON)
def test_json_comes_back_equal(document: Any) -> None:
    text = json.dumps(document, separators=(",", ":")).encode()
    assert json.loads(STATUS_PACKER.unpack(STATUS_PACKER.pack(text))) == document


def test_different_texts_pack_differently() -> None:
    a, b = b'{"phase":"Ready"}', b'{"phase":"Stalled"}'
    assert STATUS_PACKER.pack(a) != STATUS_PACKER.pack(b)


def test_a_status_packs_smaller_with_the_dictionary() -> None:
    """The point of the dictionary: what every status repeats costs little."""
    status = ProxyStatus.model_validate(
        {
            "phase": "Ready",
            "conditions": [
                {
                    "type": "Provisioned",
                    "status": "True",
                    "reason": "Provisioned",
                    "message": "applied in stack a",
                },
                {"type": "Stalled", "status": "False", "reason": "Reconciled", "message": ""},
            ],
            "stack": "a",
        }
    )
    text = status.model_dump_json(by_alias=True, exclude_defaults=True).encode()
    assert len(STATUS_PACKER.pack(text)) < len(Packer(b"").pack(text)) < len(text)


def test_a_dictionary_must_match_to_unpack() -> None:
    """Packed text is only read back with its own dictionary (each packer's is fixed for the process)."""
    text = b'{"phase":"Ready","conditions":[]}'
    packed = STATUS_PACKER.pack(text)
    try:
        read = PROXY_PACKER.unpack(packed)
    except (zlib.error, ValueError):
        return
    assert read != text


# A running proxy's status as the cluster holds it (taken from bench_running.py's cluster, 2026-12-06).
RUNNING: dict[str, Any] = {
    "address": {"host": "10.20.30.40", "port": 20000},
    "conditions": [
        {
            "lastTransitionTime": "2026-12-06T02:28:15.031594Z",
            "message": "applied in stack run-00",
            "reason": "Provisioned",
            "status": "True",
            "type": "Provisioned",
        },
        {
            "lastTransitionTime": "2026-12-06T02:28:15.033515Z",
            "message": "",
            "reason": "Reconciled",
            "status": "False",
            "type": "Stalled",
        },
        {
            "lastTransitionTime": "2026-12-06T02:29:19.820486Z",
            "message": "probe succeeded",
            "reason": "ProbeSucceeded",
            "status": "True",
            "type": "Healthy",
        },
        {
            "lastTransitionTime": "2026-12-06T02:28:15.031606Z",
            "message": "applied as declared and answering its probes (or not probed yet)",
            "reason": "Ready",
            "status": "True",
            "type": "Ready",
        },
    ],
    "egressIP": "10.20.30.41",
    "lastOperation": {
        "finishedAt": "2026-12-06T02:28:14.887260Z",
        "message": "",
        "result": "succeeded",
        "startedAt": "2026-12-06T02:26:08.978481Z",
        "type": "up",
    },
    "observedGeneration": 1,
    "observedSpecHash": "b5f91b954e9d137ea30361e23e786df19090fdfd9344569b5d8328c9b40f9a62",
    "phase": "Ready",
    "stack": "run-00",
}


@pytest.mark.parametrize("form", ["written", "board"])
def test_a_running_proxy_s_status_packs_to_about_150_bytes(form: str) -> None:
    """What a leader holds twice for each of 10,000 running proxies (issue 20): the status as the status
    writer writes it and the watch reads it back (keys sorted), and as the board keeps it (the model's
    order, Ready left out). The dictionary holds both forms whole, values left out: 963 bytes of text pack
    to about 150 (with the fields' words alone, 290 and 195)."""
    if form == "written":
        text = json.dumps(RUNNING, separators=(",", ":"), sort_keys=True).encode()
    else:
        kept = {**RUNNING, "conditions": [c for c in RUNNING["conditions"] if c["type"] != "Ready"]}
        status = ProxyStatus.model_validate(kept)
        text = status.model_dump_json(by_alias=True, exclude_defaults=True).encode()
    packed = STATUS_PACKER.pack(text)
    assert len(packed) <= 165, f"{len(text)} bytes of status packed to {len(packed)}"
    assert STATUS_PACKER.unpack(packed) == text
