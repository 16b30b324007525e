"""What a user did according to the apiserver's audit log, and what RBAC grants it: both as `Access`.

The audit log (Metadata level, JSON lines) records each request in stages (RequestReceived, then
ResponseStarted for a watch, ResponseComplete); one `Request` per auditID, with the last response code seen.
Grants come from the RBAC documents themselves (Role/ClusterRole rules reached through the bindings naming
the subject), so the comparison is with the manifests as written, not with whatever else the cluster holds.

How a grant counts as used: a request with the same API group, resource (with `/subresource`) and verb, in
the binding's namespace (a ClusterRoleBinding: any namespace, or none), on the rule's resourceName if it
names one (a list or watch by `metadata.name=` field selector carries that name). A server-side apply is
recorded as `patch`; when it creates the object (201) the apiserver also authorizes `create`, so it uses
both.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Document = dict[str, Any]


@dataclass(frozen=True, order=True)
class Access:
    """One verb on one resource, in a namespace (None: cluster-wide or a cluster-scoped request)."""

    namespace: str | None
    group: str
    resource: str  # "proxies" or "proxies/status"
    verb: str
    name: str = ""  # a grant: the rule's resourceName ("": any); a request: the object's name if any

    def __str__(self) -> str:
        named = f" {self.name}" if self.name else ""
        return f"{self.namespace or '(cluster)'}  {self.group or 'core'}  {self.resource}{named}  {self.verb}"


@dataclass(frozen=True)
class Request:
    access: Access
    code: int

    def uses(self, grant: Access) -> bool:
        """Whether this request needed `grant` (and was let through)."""
        mine = self.access
        verbs = {mine.verb} | ({"create"} if mine.verb == "patch" and self.code == 201 else set())
        return (
            self.code != 403
            and grant.group == mine.group
            and grant.resource == mine.resource
            and grant.verb in verbs
            and grant.namespace in (None, mine.namespace)
            and grant.name in ("", mine.name)
        )


def log_offset(path: Path) -> int:
    """Where the log ends now: read from here to see only what happens afterwards."""
    return path.stat().st_size if path.exists() else 0


def requests_by(path: Path, username: str, *, offset: int = 0) -> list[Request]:
    """Every resource request `username` made after `offset` (non-resource URLs such as /api left out)."""
    latest: dict[str, Document] = {}
    for event in _events(path, offset):
        if (event.get("user") or {}).get("username") != username or "objectRef" not in event:
            continue
        if event.get("responseStatus") or event["auditID"] not in latest:
            latest[event["auditID"]] = event
    return [_request(e) for e in latest.values() if e.get("responseStatus")]


def _events(path: Path, offset: int) -> Iterator[Document]:
    with path.open("rb") as log:
        log.seek(offset)
        for line in log:
            if line.strip():
                yield json.loads(line)


def _request(event: Document) -> Request:
    ref = event["objectRef"]
    resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    name = ref.get("name", "")
    access = Access(ref.get("namespace"), ref.get("apiGroup", ""), resource, event["verb"], name)
    return Request(access=access, code=int(event["responseStatus"]["code"]))


def service_account(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def grants_to(documents: Iterable[Document], *, namespace: str, name: str) -> set[Access]:
    """What the bindings among `documents` grant the ServiceAccount `namespace/name`, rule by rule."""
    documents = list(documents)
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in documents}
    found: set[Access] = set()
    for binding in documents:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subjects = {(s["kind"], s.get("namespace"), s["name"]) for s in binding["subjects"]}
        if ("ServiceAccount", namespace, name) not in subjects:
            continue
        scope = binding["metadata"]["namespace"] if binding["kind"] == "RoleBinding" else None
        ref = binding["roleRef"]
        role = roles[(ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"])]
        found |= _expand(role["rules"], scope)
    return found


def _expand(rules: list[Document], scope: str | None) -> set[Access]:
    found = set()
    for rule in rules:
        written = [*rule["apiGroups"], *rule["resources"], *rule["verbs"]]
        if "*" in written or rule.get("nonResourceURLs"):
            raise ValueError(f"a rule this comparison cannot prove (a wildcard or URLs): {rule}")
        found |= {
            Access(scope, group, resource, verb, name)
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
            for name in rule.get("resourceNames") or [""]
        }
    return found


def table(granted: set[Access], requests: list[Request], allowed_unused: dict[Access, str]) -> str:
    """Granted vs used: each grant with the requests that used it; then requests no grant here covers."""
    lines = [
        _row(Access(None, "group", "resource", "verb"), "used", "note").replace("(cluster)", "namespace")
    ]
    for grant in sorted(granted, key=lambda a: (a.namespace or "", a.group, a.resource, a.verb)):
        used = sum(r.uses(grant) for r in requests)
        note = "" if used else "UNUSED"
        if not used and grant in allowed_unused:
            note = "allowlisted: " + allowed_unused[grant]
        lines.append(_row(grant, str(used), note[:60]))
    for access, codes in uncovered(granted, requests).items():
        lines.append(_row(access, "-", f"NOT GRANTED here (codes {sorted(codes)})"))
    return "\n".join(lines)


def uncovered(granted: set[Access], requests: list[Request]) -> dict[Access, set[int]]:
    """Requests (names left out) that no grant covers, with their response codes."""
    found: dict[Access, set[int]] = {}
    for request in requests:
        if not any(request.uses(g) for g in granted):
            mine = request.access
            key = Access(mine.namespace, mine.group, mine.resource, mine.verb)
            found.setdefault(key, set()).add(request.code)
    return dict(sorted(found.items(), key=lambda item: str(item[0])))


def _row(access: Access, used: str, note: str) -> str:
    namespace, group = access.namespace or "(cluster)", access.group or "core"
    resource = access.resource + (f" {access.name}" if access.name else "")
    return f"{namespace:<16}{group:<21}{resource:<36}{access.verb:<7}{used:>5}  {note}"
