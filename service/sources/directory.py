"""A folder of multi-document YAML as the source of desired state (GitOps without a cluster).

Each poll compares the folder's fingerprint (paths, sizes, mtimes) and reloads on change. A Proxy that
disappears (file or document removed) becomes a *deleting* record: it stays, with a deletion time, until the
reconciler releases it once its resources are gone -- the same lifecycle as a finalizer in the cluster.
Nothing is lost to a typo: a Proxy document that stops parsing keeps its previous version (and is reported),
and a catalogue that stops parsing keeps the previous catalogue.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from stacks.manifests import ManifestSet, load_manifests, manifest_files
from stacks.models import ProviderCatalogue, Proxy
from stacks.problems import Problem

log = logging.getLogger(__name__)


@dataclass
class SourceChange:
    """What one poll found; empty when nothing changed."""

    catalogue: ProviderCatalogue | None = None  # set when the catalogue changed
    upserts: list[Proxy] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.catalogue is None and not self.upserts


@dataclass
class DirectorySource:
    directory: Path
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    _fingerprint: tuple[Any, ...] | None = None
    _pending: tuple[Any, ...] | None = None
    _proxies: dict[str, Proxy] = field(default_factory=dict)
    _catalogue: ProviderCatalogue | None = None
    _secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def poll(self) -> SourceChange:
        """Reload if the folder changed; return what changed for the planner."""
        if not self.directory.is_dir():
            raise FileNotFoundError(f"manifests folder {self.directory} does not exist")
        fingerprint = self._scan()
        if fingerprint == self._fingerprint:
            return SourceChange()
        if self._fingerprint is not None and fingerprint != self._pending:
            # Act on a folder only once it holds still for one poll: a `git pull` or a copy in progress
            # deletes and rewrites files, and a half-written folder must not read as deleted Proxies.
            self._pending = fingerprint
            return SourceChange()
        self._fingerprint = self._pending = fingerprint
        return self._reload(load_manifests(self.directory))

    def release(self, key: str) -> None:
        """The reconciler removed a deleting proxy's resources (or forgot them): drop the record."""
        proxy = self._proxies.get(key)
        if proxy is not None and proxy.metadata.deletion_timestamp is not None:
            del self._proxies[key]

    def proxies(self) -> list[Proxy]:
        return list(self._proxies.values())

    @property
    def catalogue(self) -> ProviderCatalogue | None:
        return self._catalogue

    def credentials_for(self, proxy: Proxy) -> dict[str, str] | None:
        ref = proxy.spec.auth.secret_ref
        if ref is None:
            return None
        return self._secrets.get(f"{ref.namespace or proxy.metadata.namespace}/{ref.name}")

    def secret_value(self, name: str, key: str) -> str | None:
        """A key of the Secret `name` (any namespace: the catalogue names Secrets without one)."""
        for ref, data in sorted(self._secrets.items()):
            if ref.rsplit("/", 1)[-1] == name and key in data:
                return data[key]
        return None

    # --- internals --------------------------------------------------------------------------------------

    def _scan(self) -> tuple[Any, ...]:
        files = manifest_files(self.directory)
        return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)

    def _reload(self, found: ManifestSet) -> SourceChange:
        change = SourceChange(problems=list(found.problems))
        self.problems = change.problems
        self._secrets = _load_secrets(found, change.problems)
        for problem in change.problems:
            log.warning("manifest problem: %s", problem)
        if found.catalogue is not None and found.catalogue != self._catalogue and len(found.catalogues) == 1:
            self._catalogue = change.catalogue = found.catalogue
        elif found.catalogue is None and self._catalogue is None and not found.broken_catalogues:
            # No catalogue at all is far likelier a wrong or empty mount than a wish to delete everything:
            # nothing is reconciled until one appears (an empty `providers: []` does mean "none").
            change.problems.append(_no_catalogue(self.directory))
        seen = {located.obj.key for located in found.proxies} | _unparsable_keys(found)
        for located in found.proxies:
            if self._proxies.get(located.obj.key) != located.obj:
                self._proxies[located.obj.key] = located.obj
                change.upserts.append(located.obj)
        for key, proxy in list(self._proxies.items()):
            if key not in seen and proxy.metadata.deletion_timestamp is None:
                leaving = proxy.model_copy(deep=True)
                leaving.metadata.deletion_timestamp = self.now()
                self._proxies[key] = leaving
                change.upserts.append(leaving)
        return change


def _no_catalogue(directory: Path) -> Problem:
    return Problem(
        file=str(directory),
        document=None,
        line=None,
        obj="catalogue",
        path="",
        message="no provider catalogue (a document with a top-level `providers` list) in this folder: "
        "nothing is reconciled until there is one; to remove every proxy, keep the catalogue and delete "
        "the Proxies",
    )


def _unparsable_keys(found: ManifestSet) -> set[str]:
    """Keys of Proxy documents that failed to parse: they keep their last version, they are not deleted."""
    keys = set()
    for problem in found.problems:
        label = problem.obj or ""
        if label.startswith("Proxy ") and not label.endswith("/?"):
            keys.add(label.removeprefix("Proxy "))
    return keys


def _load_secrets(found: ManifestSet, problems: list[Problem]) -> dict[str, dict[str, str]]:
    """`kind: Secret` documents beside the Proxies (credentials for auth.mode `secret`), from the documents
    `load_manifests` already parsed and set aside; an undecodable one is reported and left out."""
    secrets: dict[str, dict[str, str]] = {}
    for source in found.ignored:
        doc = yaml.SafeLoader("").construct_document(source.node) if source.node is not None else None
        if not (
            isinstance(doc, dict) and doc.get("kind") == "Secret" and isinstance(doc.get("metadata"), dict)
        ):
            continue
        ref = f"{doc['metadata'].get('namespace') or 'default'}/{doc['metadata'].get('name')}"
        try:
            data = {
                k: base64.b64decode(v, validate=True).decode() for k, v in (doc.get("data") or {}).items()
            }
        except (ValueError, TypeError) as exc:
            problems.append(
                Problem(
                    file=source.file,
                    document=source.document,
                    line=source.line,
                    obj=f"Secret {ref}",
                    path="data",
                    message=f"not valid base64 ({exc}): encode the values, or use stringData",
                )
            )
            continue
        data.update(doc.get("stringData") or {})
        secrets[ref] = data
    return secrets
