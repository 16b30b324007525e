"""The one boundary where Pulumi's exceptions become `automation.errors`, by what should happen next."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from automation.engine.locks import lock_owners
from automation.errors import (
    CredentialsError,
    InvalidInputError,
    ProxyOperatorError,
    Reason,
    StackLockedError,
    TransientError,
)

if TYPE_CHECKING:
    from pulumi import automation as auto

STACK_NOT_FOUND = "StackNotFound"

# Patterns in the CLI's output, checked in order. Kept as data so a new case is one line.
_PERMANENT = [
    (
        re.compile(
            r"(invalid_grant|could not find default credentials|401 unauthorized|permission denied "
            r"\(publickey\)|403 forbidden|authentication failed|is forbidden: User )",
            re.I,
        ),
        CredentialsError,
        Reason.CREDENTIALS_REJECTED,
    ),
    (
        re.compile(
            r"(InvalidInput|invalid (spec|configuration)|is not a host of provider"
            r"|missing required configuration)",
            re.I,
        ),
        InvalidInputError,
        Reason.INVALID_INPUT,
    ),
]
_TRANSIENT = [
    (re.compile(r"(quota|rate ?limit|429 too many)", re.I), Reason.QUOTA),
    (
        re.compile(
            r"(connection refused|timed? ?out|no such host|temporary failure|connection reset|EOF)", re.I
        ),
        Reason.NETWORK,
    ),
]


LIMIT = 2000  # characters of the CLI's output a message keeps


def translate(exc: auto.errors.CommandError, *, stack: str) -> ProxyOperatorError:
    """Map a failed CLI call to a permanent or transient error with a short, useful message."""
    from pulumi import automation as auto  # loaded already: `exc` is one of its errors

    whole = _message(exc)  # a permanent error's whole reason may sit past the cut
    text = whole[:LIMIT]
    if isinstance(exc, auto.errors.ConcurrentUpdateError):
        holders = tuple(f"{o.user}@{o.host} (pid {o.pid})" for o in lock_owners(str(exc)))
        return StackLockedError(f"stack {stack} is locked by another operation: {text}", holders=holders)
    if isinstance(exc, auto.errors.StackNotFoundError):
        return InvalidInputError(f"stack {stack} does not exist", reason=STACK_NOT_FOUND)
    for pattern, error_type, reason in _PERMANENT:
        if pattern.search(text):
            return error_type(f"stack {stack}: {_leading(pattern, whole)[:LIMIT]}", reason=reason)
    for pattern, reason in _TRANSIENT:
        if pattern.search(text):
            return TransientError(f"stack {stack}: {text}", reason=reason)
    return TransientError(f"stack {stack}: {text}", reason=Reason.TRANSIENT)


def _message(exc: auto.errors.CommandError) -> str:
    """The diagnostics part of the CLI's output, without the progress noise; at most a few lines."""
    raw = str(exc)
    lines = [line.strip() for line in raw.splitlines() if line.strip()]
    # Errors, and the lock owners a "currently locked" error lists (who holds it: user@host, pid, time).
    keep = ("error", "exception", "created by")
    wanted = [line for line in lines if any(word in line.lower() for word in keep)]
    picked = wanted or lines[-5:]
    return " | ".join(dict.fromkeys(picked))


def _leading(pattern: re.Pattern[str], text: str) -> str:
    """The message with the part that says what is wrong first: a program's own `InvalidInput: ...` line
    (what to fix) comes after the CLI's progress and traceback lines, and a shortened condition loses it."""
    parts = text.split(" | ")
    hits = [part for part in parts if pattern.search(part)]
    if not hits:
        return text
    hit = max(hits, key=len)  # the progress display shortens a line that the diagnostics give whole
    return " | ".join([hit, *(part for part in parts if part != hit)])
