"""How a problem in the manifests is reported: where, which object, which field, what is wrong, what to do.

pydantic's messages say what is wrong; `describe_error` adds the "what to do" for the built-in error types
(our own validators already write both halves).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from stacks.models import PROVIDER_TYPES

DNS1123_HINT = (
    "use lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters"
)
_HINTS = {
    "missing": "add this field",
    "extra_forbidden": "remove it or fix its spelling (see docs/providers.md)",
    "greater_than_equal": "raise it into the allowed range",
    "less_than_equal": "lower it into the allowed range",
    "literal_error": "use one of the listed values",
    "enum": "use one of the listed values",
    "union_tag_invalid": "set `type` to one of the listed provider types",
    "union_tag_not_found": "add `type` (kubernetes, gcp, kvm or local)",
    "too_short": "add at least one item",
}


@dataclass(frozen=True)
class Problem:
    """One thing wrong: file, document (0-based), line, the object, the field path, the message."""

    file: str
    document: int | None
    line: int | None
    obj: str
    path: str
    message: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        if self.document is not None:
            where += f" (document {self.document + 1})"
        return f"{where} {self.obj} {self.path or '(object)'}: {self.message}"


def field_path(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """pydantic's error location in wire names, without the union tag that discriminated unions insert."""
    parts: list[str | int] = []
    for index, part in enumerate(loc):
        if _is_union_tag(loc, index):
            continue
        parts.append(to_camel(part) if isinstance(part, str) and "_" in part else part)
    return tuple(parts)


def render_path(parts: tuple[str | int, ...]) -> str:
    """("spec", "kvm", "host") -> spec.kvm.host; ("providers", 2, "name") -> providers[2].name."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def describe_error(error: ErrorDetails) -> str:
    """pydantic's message with the offending value and what to do."""
    kind = error["type"]
    message = error["msg"].removeprefix("Value error, ")
    if kind == "value_error":
        return message  # ours: already says what to do
    if kind in ("string_pattern_mismatch", "string_too_long", "string_too_short") and _is_name(error):
        return f"{_shown(error['input'])} is not a DNS-1123 label: {DNS1123_HINT}"
    got = "" if kind in ("missing", "extra_forbidden") else f", got {_shown(error['input'])}"
    return f"{message}{got}: {_HINTS.get(kind, 'fix the value')}"


def _is_name(error: ErrorDetails) -> bool:
    pattern = str((error.get("ctx") or {}).get("pattern", ""))
    return pattern.startswith("^[a-z0-9]") or error["loc"][-1:] in (("name",), ("provider",), ("namespace",))


def _is_union_tag(loc: tuple[str | int, ...], index: int) -> bool:
    # providers.<i>.<type>.field: pydantic names the chosen union member after the index.
    return index == 2 and loc[index] in PROVIDER_TYPES and loc[0] == "providers" and isinstance(loc[1], int)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
