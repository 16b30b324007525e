"""A directory of multi-document YAML -> Proxies and a catalogue, each remembering where it came from.

Every object keeps its file, document index and line, so a problem can say exactly where to look. Documents
that fail to parse become `Problem`s instead of exceptions: one bad Proxy never hides the others. A document
that looks meant for us but is not exactly ours (`kind: proxy`, `crawl.example.com/v1`) is a problem too,
never set aside with the others (stacks/kinds.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml
from pydantic import ValidationError

from stacks.catalogue import CatalogueFormatError, catalogue_body, is_catalogue_document
from stacks.kinds import catalogue_near_miss, not_ours_message
from stacks.models import (
    API_VERSION,
    KIND,
    POOL_KIND,
    ProviderCatalogue,
    Proxy,
    ProxyPool,
    duplicate_names_message,
)
from stacks.problems import Problem, describe_error, field_path, render_path

T = TypeVar("T")
YAML_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class Source:
    """Where a document sits: file, 0-based document index, 1-based line of its start."""

    file: str
    document: int
    line: int
    node: yaml.Node | None = field(default=None, compare=False, repr=False)

    def line_of(self, path: tuple[str | int, ...]) -> int:
        """The line of the deepest node along `path` (wire names), for pointing at a field."""
        node, line = self.node, self.line
        for part in path:
            node = _child(node, part)
            if node is None:
                break
            line = node.start_mark.line + 1
        return line


@dataclass(frozen=True)
class Located(Generic[T]):
    source: Source
    obj: T


@dataclass
class ManifestSet:
    proxies: list[Located[Proxy]] = field(default_factory=list)
    pools: list[Located[ProxyPool]] = field(default_factory=list)
    catalogues: list[Located[ProviderCatalogue]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    ignored: list[Source] = field(default_factory=list)
    root: str = ""
    broken_catalogues: int = 0  # catalogue documents that failed to parse (their problems are listed)

    @property
    def catalogue(self) -> ProviderCatalogue | None:
        return self.catalogues[0].obj if self.catalogues else None


def manifest_files(directory: Path) -> list[Path]:
    """*.yaml / *.yml under `directory`, sorted; hidden paths skipped (a ConfigMap or Secret mounted as a
    folder keeps timestamped copies in `..<time>/` and a `..data` link beside the visible files)."""
    return sorted(
        path
        for path in directory.rglob("*")
        if path.suffix in YAML_SUFFIXES
        and not any(part.startswith(".") for part in path.relative_to(directory).parts)
        and path.is_file()
    )


def load_manifests(directory: Path) -> ManifestSet:
    """Every *.yaml / *.yml under `directory` (sorted, recursive), split into Proxies and catalogues."""
    found = ManifestSet(root=str(directory))
    for path in manifest_files(directory):
        for source, document in _documents(path, found):
            _classify(source=source, document=document, into=found)
    return found


def _documents(path: Path, found: ManifestSet) -> Iterator[tuple[Source, Any]]:
    try:
        nodes = list(yaml.compose_all(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        message = f"not valid YAML ({exc}): fix the syntax"
        found.problems.append(
            Problem(str(path), None, None if line is None else line + 1, "file", "", message)
        )
        return
    except OSError as exc:
        message = f"cannot be read ({exc.strerror or exc}): check its permissions"
        found.problems.append(Problem(str(path), None, None, "file", "", message))
        return
    for index, node in enumerate(nodes):
        if node is None:
            continue
        source = Source(file=str(path), document=index, line=node.start_mark.line + 1, node=node)
        yield source, yaml.SafeLoader("").construct_document(node)


def _classify(*, source: Source, document: Any, into: ManifestSet) -> None:
    if document is None:
        return
    if not isinstance(document, Mapping):
        into.problems.append(_problem(source, "document", (), "is not a mapping: write a Kubernetes object"))
    elif document.get("kind") == KIND and document.get("apiVersion") == API_VERSION:
        _add_proxy(source=source, document=document, into=into)
    elif document.get("kind") == POOL_KIND and document.get("apiVersion") == API_VERSION:
        _add_pool(source=source, document=document, into=into)
    elif is_catalogue_document(document):
        _add_catalogue(source=source, document=document, into=into)
    else:
        _refuse_or_ignore(source=source, document=document, into=into)


def _refuse_or_ignore(*, source: Source, document: Mapping[str, Any], into: ManifestSet) -> None:
    """A document that looks meant for us but is not exactly ours is a problem of the whole document (the
    read is not clean, so nothing it may have been meant as is deleted); any other document is set aside."""
    message = not_ours_message(document)
    if message is not None:
        field = "apiVersion" if document.get("kind") in (KIND, POOL_KIND) else "kind"
        into.problems.append(_problem(source, "document", (field,), message))
        return
    message = catalogue_near_miss(document)
    if message is not None:
        into.broken_catalogues += 1
        into.problems.append(_problem(source, "catalogue", ("kind",), message))
        return
    into.ignored.append(source)


def proxy_label(document: Mapping[str, Any], kind: str = KIND) -> str:
    """`Proxy ns/name` (or `ProxyPool ns/name`) from a raw document, as far as it can be read."""
    metadata = document.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    return f"{kind} {metadata.get('namespace') or 'default'}/{metadata.get('name') or '?'}"


def _add_proxy(*, source: Source, document: Mapping[str, Any], into: ManifestSet) -> None:
    try:
        into.proxies.append(Located(source, Proxy.model_validate(document)))
    except ValidationError as exc:
        label = proxy_label(document)
        for error in exc.errors():
            into.problems.append(_problem(source, label, error["loc"], describe_error(error)))


def _add_pool(*, source: Source, document: Mapping[str, Any], into: ManifestSet) -> None:
    try:
        into.pools.append(Located(source, ProxyPool.model_validate(document)))
    except ValidationError as exc:
        label = proxy_label(document, POOL_KIND)
        for error in exc.errors():
            into.problems.append(_problem(source, label, error["loc"], describe_error(error)))


def _add_catalogue(*, source: Source, document: Mapping[str, Any], into: ManifestSet) -> None:
    try:
        body = catalogue_body(document)
        into.catalogues.append(Located(source, ProviderCatalogue.model_validate(body)))
    except CatalogueFormatError as exc:
        into.broken_catalogues += 1
        into.problems.append(_problem(source, "catalogue", (), str(exc)))
    except ValidationError as exc:
        into.broken_catalogues += 1
        for error in exc.errors():
            label = _catalogue_label(body, error["loc"])
            into.problems.append(_problem(source, label, error["loc"], describe_error(error)))
        into.problems += _raw_duplicates(source, body, already=str(exc))


def _raw_duplicates(source: Source, body: Mapping[str, Any], *, already: str) -> list[Problem]:
    # An entry with errors stops pydantic before the uniqueness check; report repeated names anyway.
    providers = body.get("providers")
    if not isinstance(providers, list):
        return []
    names = [entry.get("name") if isinstance(entry, Mapping) else None for entry in providers]
    message = duplicate_names_message(names)
    if message is None or message in already:
        return []
    return [_problem(source, "catalogue", ("providers",), message)]


def _catalogue_label(body: Mapping[str, Any], loc: tuple[str | int, ...]) -> str:
    providers = body.get("providers")
    if len(loc) > 1 and loc[0] == "providers" and isinstance(loc[1], int) and isinstance(providers, list):
        entry = providers[loc[1]] if loc[1] < len(providers) else None
        if isinstance(entry, Mapping) and entry.get("name"):
            return f"provider {entry['name']}"
    return "catalogue"


def _problem(source: Source, label: str, loc: tuple[str | int, ...], message: str) -> Problem:
    parts = field_path(loc)
    return Problem(
        file=source.file,
        document=source.document,
        line=source.line_of(parts),
        obj=label,
        path=render_path(parts),
        message=message,
    )


def _child(node: yaml.Node | None, part: str | int) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        return next((value for key, value in node.value if key.value == part), None)
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        return node.value[part]
    return None
