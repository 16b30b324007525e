"""The probe's failure, shared by the prober and its connection."""

from __future__ import annotations


class ProbeFailed(Exception):
    """A probe failed with `outcome` (connect_error, auth_failed, proxy_error, bad_status, bad_response)."""

    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome
