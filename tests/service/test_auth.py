"""Tokens file parsing, hashed comparison and reload on change."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from service.auth import Scope, TokenAuthenticator, TokenFileError, hash_token, parse_tokens

YAML = f"""
- name: crawler
  scopes: [lease, report]
  sha256: {hash_token("s3cret")}
- name: ops
  scopes: [admin]
  sha256: {hash_token("root")}
"""


def test_yaml_entries_authenticate_by_hash() -> None:
    auth = TokenAuthenticator(parse_tokens(YAML))
    client = auth.authenticate("s3cret")
    assert client is not None
    assert client.name == "crawler"
    assert client.scopes == {Scope.lease, Scope.report}
    assert auth.authenticate("root").scopes == {Scope.admin}  # type: ignore[union-attr]
    assert auth.authenticate("S3cret") is None
    assert auth.authenticate("") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[{name: a, scopes: [lease]}]", "0.sha256"),
        (f"[{{name: a, scopes: [fly], sha256: {hash_token('x')}}}]", "0.scopes"),
        ("[{name: a, scopes: [lease], sha256: plain-token}]", "0.sha256"),
        (f"[{{name: a, scopes: [], sha256: {hash_token('x')}, extra: 1}}]", "0.extra"),
        ("{not: a list}", "list"),
        ("[: bad yaml", "not YAML"),
    ],
)
def test_malformed_files_name_the_entry_and_field(text: str, message: str) -> None:
    with pytest.raises(TokenFileError, match=message):
        parse_tokens(text)


def test_duplicate_names_are_refused() -> None:
    entry = {"name": "a", "scopes": ["lease"], "sha256": hash_token("x")}
    with pytest.raises(TokenFileError, match="unique"):
        parse_tokens(json.dumps([entry, {**entry, "sha256": hash_token("y")}]))


def test_the_file_is_reread_when_it_changes_and_a_bad_edit_keeps_the_old_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(YAML)
    auth = TokenAuthenticator(path=path)
    assert auth.authenticate("s3cret") is not None
    path.write_text(json.dumps([{"name": "new", "scopes": ["lease"], "sha256": hash_token("fresh")}]))
    os.utime(path, ns=(1, 1))  # a different mtime, as a Secret update gives
    assert auth.authenticate("s3cret") is None
    assert auth.authenticate("fresh").name == "new"  # type: ignore[union-attr]
    path.write_text("[: broken")
    os.utime(path, ns=(2, 2))
    assert auth.authenticate("fresh") is not None


def test_a_missing_file_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(TokenFileError, match="cannot read"):
        TokenAuthenticator(path=tmp_path / "absent.yaml")
