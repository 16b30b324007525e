"""A `coordination.k8s.io/v1` Lease as raw JSON: read it, create it, replace it with its resourceVersion.

Blocking calls (the client is synchronous); the elector runs them in threads. A replace carries the
resourceVersion it was read at, so two candidates racing for the same Lease get one success and one 409.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import urllib3
from kubernetes.client import ApiClient

from service.kube.client import ApiException, request_json

__all__ = [
    "API_ERRORS",
    "Lease",
    "LeaseRecord",
    "format_time",
    "parse_time",
    "read_lease",
    "utcnow",
    "write_lease",
]

# What a call can raise: a refusal, a dropped or timed-out connection (urllib3's errors are not OSErrors),
# a body that is not JSON.
API_ERRORS = (ApiException, OSError, TimeoutError, urllib3.exceptions.HTTPError, ValueError)


def utcnow() -> datetime:
    return datetime.now(UTC)


def format_time(moment: datetime) -> str:
    """A MicroTime as the apiserver writes it: RFC 3339, microseconds, Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass(frozen=True)
class LeaseRecord:
    """The election fields of a Lease's spec."""

    holder: str | None = None
    duration_seconds: int | None = None
    acquired: datetime | None = None
    renewed: datetime | None = None
    transitions: int = 0

    def expires(self) -> datetime | None:
        """When the holder loses it unless it renews; None when nobody holds it."""
        if not self.holder or self.renewed is None or not self.duration_seconds:
            return None
        return self.renewed + timedelta(seconds=self.duration_seconds)

    def free(self, now: datetime) -> bool:
        """Nobody holds it, or its holder has not renewed within its duration."""
        expires = self.expires()
        return expires is None or expires < now

    def taken_by(self, identity: str, *, now: datetime, duration: float) -> LeaseRecord:
        """This record after `identity` acquired or renewed it at `now`; taking it from another holder, or
        after a release, is a transition."""
        ours = self.holder == identity
        return LeaseRecord(
            holder=identity,
            duration_seconds=math.ceil(duration),  # the field is an int32
            acquired=self.acquired if ours and self.acquired else now,
            renewed=now,
            transitions=self.transitions if ours else self.transitions + 1,
        )

    @classmethod
    def first(cls, identity: str, *, now: datetime, duration: float) -> LeaseRecord:
        """The record of a Lease created by `identity` (no transition yet, as client-go counts)."""
        return cls(holder=identity, duration_seconds=math.ceil(duration), acquired=now, renewed=now)

    def released(self, now: datetime) -> LeaseRecord:
        """Given up on a clean stop: no holder, so the next candidate takes it at once."""
        return replace(self, holder=None, renewed=now)

    def spec(self) -> dict[str, Any]:
        fields = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration_seconds,
            "acquireTime": format_time(self.acquired) if self.acquired else None,
            "renewTime": format_time(self.renewed) if self.renewed else None,
            "leaseTransitions": self.transitions,
        }
        return {key: value for key, value in fields.items() if value is not None}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> LeaseRecord:
        return cls(
            holder=spec.get("holderIdentity") or None,
            duration_seconds=spec.get("leaseDurationSeconds"),
            acquired=parse_time(spec.get("acquireTime")),
            renewed=parse_time(spec.get("renewTime")),
            transitions=int(spec.get("leaseTransitions") or 0),
        )


@dataclass(frozen=True)
class Lease:
    """A Lease as read: the raw object (kept whole, so a replace keeps labels and annotations) and its
    record."""

    raw: dict[str, Any]
    record: LeaseRecord


def _path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    return f"{base}/{name}" if name else base


def read_lease(api: ApiClient, *, namespace: str, name: str, timeout: float) -> Lease | None:
    """The Lease, or None when it does not exist. Raises ApiException on any other refusal."""
    try:
        raw = request_json(api, "GET", _path(namespace, name), timeout=timeout)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return Lease(raw=raw, record=LeaseRecord.from_spec(raw.get("spec") or {}))


def write_lease(
    api: ApiClient, *, namespace: str, name: str, current: Lease | None, record: LeaseRecord, timeout: float
) -> Lease:
    """Create the Lease (current is None) or replace `current` at its resourceVersion. A 409 (someone
    else created or changed it since it was read) raises ApiException with status 409."""
    if current is None:
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": record.spec(),
        }
        raw = request_json(api, "POST", _path(namespace), body=body, timeout=timeout)
    else:
        body = {**current.raw, "spec": record.spec()}  # metadata.resourceVersion: optimistic concurrency
        raw = request_json(api, "PUT", _path(namespace, name), body=body, timeout=timeout)
    return Lease(raw=raw, record=LeaseRecord.from_spec(raw.get("spec") or {}))
