"""A folder of multi-document YAML as the source of desired state (GitOps without a cluster).

Each poll compares the folder's fingerprint (paths, sizes, mtimes) and reloads once the folder has held still
for one poll. The source follows the contract of `service.sources.contract`: a reload says whether it read
the folder completely and cleanly, and only a complete read declares deletions -- of the Proxies it knew
(from earlier reads, or `track`ed from the backend's applied state) that are absent now. A deleting Proxy
stays, with its deletion time, until the reconciler releases it once its resources are gone: the same
lifecycle as a finalizer in the cluster. Nothing is lost to a typo: a file that does not parse holds every
Proxy it held, an invalid Proxy document holds that Proxy, a catalogue that stops parsing keeps the previous
catalogue.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from service.sources.contract import Hold, SourceChange
from stacks.manifests import ManifestSet, load_manifests, manifest_files
from stacks.models import KIND, ProviderCatalogue, Proxy
from stacks.models.conditions import Reason
from stacks.problems import Problem

log = logging.getLogger(__name__)

__all__ = ["DirectorySource", "SourceChange"]


@dataclass
class DirectorySource:
    directory: Path
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    _fingerprint: tuple[Any, ...] | None = None
    _pending: tuple[Any, ...] | None = None
    _proxies: dict[str, Proxy] = field(default_factory=dict)
    _tracked: dict[str, Proxy] = field(default_factory=dict)  # applied in the backend, not read yet
    _files: dict[str, str] = field(default_factory=dict)  # key -> the file that declared it last
    _catalogue: ProviderCatalogue | None = None
    _secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    _last: ManifestSet | None = None
    _rejudge: bool = False
    problems: list[Problem] = field(default_factory=list)

    def poll(self) -> SourceChange:
        """Reload if the folder changed (or newly tracked proxies need judging); return what changed."""
        if not self.directory.is_dir():
            raise FileNotFoundError(f"manifests folder {self.directory} does not exist")
        fingerprint = self._scan()
        if fingerprint == self._fingerprint:
            return self._judge_tracked() if self._rejudge and self._last is not None else SourceChange()
        if self._fingerprint is not None and fingerprint != self._pending:
            # Act on a folder only once it holds still for one poll: a `git pull` or a copy in progress
            # deletes and rewrites files, and a half-written folder must not read as deleted Proxies.
            self._pending = fingerprint
            return SourceChange()
        self._fingerprint = self._pending = fingerprint
        self._last = load_manifests(self.directory)
        return self._reload(self._last, fresh=True)

    def track(self, proxies: Iterable[Proxy]) -> None:
        """Proxies the backend holds applied: judged at the next poll against the last read."""
        for proxy in proxies:
            if proxy.key not in self._proxies:
                self._tracked[proxy.key] = proxy
                self._rejudge = True

    def backend_loaded(self) -> None:
        """Nothing to wait for: a folder declares a deletion only by a complete read against `track`."""

    def release(self, key: str) -> None:
        """The reconciler removed a deleting proxy's resources (or forgot them): drop the record."""
        proxy = self._proxies.get(key)
        if proxy is not None and proxy.metadata.deletion_timestamp is not None:
            del self._proxies[key]
            self._files.pop(key, None)

    def proxies(self) -> list[Proxy]:
        return list(self._proxies.values())

    @property
    def catalogue(self) -> ProviderCatalogue | None:
        return self._catalogue

    @property
    def manifest_set(self) -> ManifestSet | None:
        """The last complete load of the folder (pools read their documents from it)."""
        return self._last

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

    def _judge_tracked(self) -> SourceChange:
        assert self._last is not None
        return self._reload(self._last, fresh=False)

    def _reload(self, found: ManifestSet, *, fresh: bool) -> SourceChange:
        self._rejudge = False
        change = SourceChange(problems=list(found.problems), reread=True)
        self._secrets = _load_secrets(found, change.problems)
        self._take_catalogue(found, change)
        change.complete = _is_complete(found, change.problems, has_catalogue=found.catalogue is not None)
        if fresh:
            self.problems = change.problems
            for problem in change.problems:
                log.warning("manifest problem: %s", problem)
        invalid = _invalid_proxies(found)
        for located in found.proxies:
            key = located.obj.key
            self._files[key] = located.source.file
            self._tracked.pop(key, None)
            if self._proxies.get(key) != located.obj:
                self._proxies[key] = located.obj
                change.upserts.append(located.obj)
        for key, problem in invalid.items():
            self._files[key] = problem.file
            change.held[key] = Hold(Reason.INVALID_SPEC, str(problem))
        seen = {located.obj.key for located in found.proxies} | set(invalid)
        for key in sorted(self._known() - seen):
            if change.complete:
                change.deletions.append(self._declare_deleted(key))
            else:
                change.held[key] = self._absent_hold(key, change.problems)
        return change

    def _take_catalogue(self, found: ManifestSet, change: SourceChange) -> None:
        if found.catalogue is not None and found.catalogue != self._catalogue and len(found.catalogues) == 1:
            self._catalogue = change.catalogue = found.catalogue
        elif found.catalogue is None and self._catalogue is None and not found.broken_catalogues:
            # No catalogue at all is far likelier a wrong or empty mount than a wish to delete everything:
            # nothing is reconciled until one appears (an empty `providers: []` does mean "none").
            change.problems.append(_no_catalogue(self.directory))
        elif found.catalogue is None and not found.broken_catalogues:
            change.problems.append(_catalogue_gone(self.directory))

    def _known(self) -> set[str]:
        live = {key for key, proxy in self._proxies.items() if proxy.metadata.deletion_timestamp is None}
        return live | set(self._tracked)

    def _declare_deleted(self, key: str) -> Proxy:
        leaving = (self._proxies.get(key) or self._tracked.pop(key)).model_copy(deep=True)
        leaving.metadata.deletion_timestamp = self.now()
        self._proxies[key] = leaving
        return leaving

    def _absent_hold(self, key: str, problems: list[Problem]) -> Hold:
        """Why an absent proxy is held: it may sit in a file that cannot be read, or the read was not
        complete for another reason (no catalogue, a Proxy without a name)."""
        file = self._files.get(key)
        broken = [p for p in problems if p.obj == "file"]
        own = next((p for p in broken if p.file == file), None)
        if own is not None:
            return Hold(
                Reason.MANIFEST_UNREADABLE,
                f"{file} cannot be read ({own.message}); its last applied version stays until it does",
            )
        if broken:
            files = "; ".join(f"{p.file}: {p.message}" for p in broken)
            return Hold(
                Reason.MANIFEST_UNREADABLE,
                f"not found in the manifests that could be read, and these could not: {files}. Absence is "
                "not a deletion until every file reads; fix them, then remove the Proxy if you mean to",
            )
        first = next((p for p in problems if _blocks_completeness(p)), None)
        why = str(first) if first is not None else "the manifests were not read completely"
        return Hold(
            Reason.NOT_IN_COMPLETE_READ,
            f"not found in the manifests, but they were not read completely ({why}): absence is not a "
            "deletion until the folder reads cleanly; fix that problem, then remove the Proxy if you mean to",
        )


def _is_complete(found: ManifestSet, problems: list[Problem], *, has_catalogue: bool) -> bool:
    """A read may declare deletions only when every file parsed, the one catalogue parsed, and every
    Proxy document can at least be named."""
    if not has_catalogue or found.broken_catalogues or len(found.catalogues) > 1:
        return False
    return not any(_blocks_completeness(problem) for problem in problems)


def _blocks_completeness(problem: Problem) -> bool:
    # A whole file lost, a document that is not an object, a catalogue problem, or a Proxy without a name.
    label = problem.obj or ""
    return label in ("file", "document", "catalogue") or label.endswith("/?")


def _invalid_proxies(found: ManifestSet) -> dict[str, Problem]:
    """Proxy documents that failed to parse but can be named: they are present (held), not deleted."""
    invalid: dict[str, Problem] = {}
    for problem in found.problems:
        label = problem.obj or ""
        if label.startswith(f"{KIND} ") and not label.endswith("/?"):
            invalid.setdefault(label.removeprefix(f"{KIND} "), problem)
    return invalid


def _no_catalogue(directory: Path) -> Problem:
    return _catalogue_problem(
        directory,
        "no provider catalogue (a document with a top-level `providers` list) in this folder: nothing is "
        "reconciled until there is one; to remove every proxy, keep the catalogue and delete the Proxies",
    )


def _catalogue_gone(directory: Path) -> Problem:
    return _catalogue_problem(
        directory,
        "the provider catalogue is gone from this folder: the last one is kept and nothing is removed until "
        "it is back (to remove every proxy, keep the catalogue and delete the Proxies)",
    )


def _catalogue_problem(directory: Path, message: str) -> Problem:
    return Problem(file=str(directory), document=None, line=None, obj="catalogue", path="", message=message)


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
