"""Bearer tokens: a file (or a mounted Secret) listing `{name, scopes, sha256}`; tokens never stored in clear.

The file is YAML or JSON (JSON is YAML). It is re-read when its modification time changes, so rotating the
Secret needs no restart. Every check hashes the presented token and compares it with every entry with
`hmac.compare_digest`, so the time taken does not depend on which entry (if any) matches.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class Scope(StrEnum):
    lease = "lease"
    report = "report"
    admin = "admin"
    view = "view"  # the fleet page (service/ui); admin implies it


def can_view(scopes: frozenset[Scope]) -> bool:
    return Scope.view in scopes or Scope.admin in scopes


class TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$", description="The client's name.")
    scopes: frozenset[Scope]
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the token: `hash_token(t)`.")
    lease_share: float | None = Field(
        None, alias="leaseShare", gt=0, le=1, description="This client's lease_share (else the server's)."
    )
    lease_rate: float | None = Field(
        None, alias="leaseRate", gt=0, le=100_000, description="This client's lease_rate (else the server's)."
    )


_ENTRIES = TypeAdapter(list[TokenEntry])
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Client:
    name: str
    scopes: frozenset[Scope]
    lease_share: float | None = None  # None: the server's discovery settings decide
    lease_rate: float | None = None


class TokenFileError(ValueError):
    """The tokens file is missing or malformed; the message names the entry and field."""


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def fingerprint_of(sha256: str) -> str:
    """A hash of the entry's hash: a session names its token's entry with it, and a new token for the same
    name (a rotation) ends the sessions of the old one."""
    return hashlib.sha256(b"session:" + sha256.encode()).hexdigest()[:32]


def parse_tokens(text: str, *, source: str = "tokens") -> list[TokenEntry]:
    try:
        data = yaml.safe_load(text)
        entries = _ENTRIES.validate_python(data if data is not None else [])
    except yaml.YAMLError as exc:
        raise TokenFileError(f"{source}: not YAML/JSON: {exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise TokenFileError(
            f"{source}: entry {where}: {first['msg']} (expected a list of {{name, scopes, sha256}})"
        ) from exc
    names = [e.name for e in entries]
    if len(names) != len(set(names)):
        raise TokenFileError(f"{source}: client names must be unique")
    return entries


class TokenAuthenticator:
    """Checks bearer tokens against entries, from a list or from a file that is re-read on change."""

    def __init__(self, entries: list[TokenEntry] | None = None, *, path: Path | None = None) -> None:
        self._entries: list[tuple[bytes, Client]] = []
        self._set_entries(list(entries or []))
        self._path = path
        self._mtime: int | None = None
        self._lock = threading.Lock()
        if path is not None:
            self._reload()

    def authenticate(self, token: str) -> Client | None:
        self._maybe_reload()
        digest = hash_token(token).encode()
        found: Client | None = None
        for sha256, client in self._entries:  # no early exit: constant time in the position of the match
            if hmac.compare_digest(digest, sha256):
                found = client
        return found

    def by_fingerprint(self, name: str, fingerprint: str) -> Client | None:
        """The client whose entry has this name and fingerprint (a page session's), if still in the file."""
        self._maybe_reload()
        for sha256, client in self._entries:
            if client.name == name and hmac.compare_digest(fingerprint_of(sha256.decode()), fingerprint):
                return client
        return None

    def fingerprint(self, token: str) -> str | None:
        """A value naming the token's entry without being usable as a credential (the session keeps it)."""
        return fingerprint_of(hash_token(token)) if self.authenticate(token) is not None else None

    def client_names(self) -> list[str]:
        self._maybe_reload()
        return [client.name for _sha256, client in self._entries]

    def _set_entries(self, entries: list[TokenEntry]) -> None:
        # What each check needs, made once per load rather than per request.
        self._entries = [
            (
                e.sha256.encode(),
                Client(name=e.name, scopes=e.scopes, lease_share=e.lease_share, lease_rate=e.lease_rate),
            )
            for e in entries
        ]

    def _maybe_reload(self) -> None:
        if self._path is None:
            return
        try:
            mtime = os.stat(self._path).st_mtime_ns
        except OSError:
            return  # a Secret being swapped: keep the last good entries
        if mtime == self._mtime:
            return
        try:
            self._reload()
        except TokenFileError as exc:
            self._mtime = mtime  # keep serving the last good entries; say why once
            log.error("ignoring the changed tokens file: %s", exc)

    def _reload(self) -> None:
        assert self._path is not None
        with self._lock:
            try:
                mtime = os.stat(self._path).st_mtime_ns
                text = self._path.read_text()
            except OSError as exc:
                raise TokenFileError(f"{self._path}: cannot read the tokens file: {exc}") from exc
            self._set_entries(parse_tokens(text, source=str(self._path)))
            self._mtime = mtime
