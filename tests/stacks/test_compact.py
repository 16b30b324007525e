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
