"""Errors of the automation layer, split by what should happen next.

- `PermanentError`: retrying cannot help (invalid spec, unknown provider, rejected credentials, a missing
  KVM host). The stack waits until its input changes.
- `TransientError`: the same input may succeed later (network, quota, a held stack lock). The stack is
  retried after a backoff delay, or after `retry_after` when the cause knows better.

Pulumi exceptions are translated into these at one boundary (the engine), chained with `raise ... from exc`.
"""

from __future__ import annotations

from typing import ClassVar

from stacks.models.conditions import Reason

__all__ = [
    "CredentialsError",
    "InvalidInputError",
    "PermanentError",
    "ProxyOperatorError",
    "Reason",
    "StackLockedError",
    "StackNotOwnedError",
    "TransientError",
    "UnknownProviderError",
    "classify",
]


class ProxyOperatorError(Exception):
    """Base of every error the automation layer raises on purpose."""

    default_reason: ClassVar[str] = Reason.ERROR

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason

    def __repr__(self) -> str:
        return f"{type(self).__name__}(reason={self.reason!r}, message={self.message!r})"


class PermanentError(ProxyOperatorError):
    """No retry until the input changes: the same input would fail the same way."""

    default_reason = Reason.INVALID_INPUT


class InvalidInputError(PermanentError):
    """A spec or catalogue entry the program cannot turn into resources (includes a missing KVM host)."""

    default_reason = Reason.INVALID_INPUT


class UnknownProviderError(PermanentError):
    """A Proxy names a provider that the catalogue does not hold."""

    default_reason = Reason.UNKNOWN_PROVIDER


class CredentialsError(PermanentError):
    """The provider rejected our credentials; someone has to fix the Secret."""

    default_reason = Reason.CREDENTIALS_REJECTED


class TransientError(ProxyOperatorError):
    """Retry later: `retry_after` (seconds) overrides the backoff policy when the cause says how long."""

    default_reason = Reason.TRANSIENT

    def __init__(self, message: str, *, reason: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, reason=reason)
        if retry_after is not None and retry_after < 0:
            raise ValueError(f"retry_after must be >= 0 seconds, got {retry_after}")
        self.retry_after = retry_after


class StackLockedError(TransientError):
    """Another operation holds the stack's lock; it is released when that operation ends. `holders`: who
    holds it as the CLI reports each lock (`user@host (pid N)`), empty when the message names none."""

    default_reason = Reason.STACK_LOCKED

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        retry_after: float | None = None,
        holders: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message, reason=reason, retry_after=retry_after)
        self.holders = holders


def classify(exc: Exception) -> ProxyOperatorError:
    """Our own errors pass through; anything else is an unexpected, transient failure (cause kept)."""
    if isinstance(exc, ProxyOperatorError):
        return exc
    error = TransientError(f"{type(exc).__name__}: {exc}", reason=Reason.UNEXPECTED)
    error.__cause__ = exc
    return error


class StackNotOwnedError(PermanentError):
    """The stack belongs to another installation (or to none we may adopt): we never touch it."""

    default_reason = Reason.STACK_NOT_OWNED
