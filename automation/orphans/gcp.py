"""GCP orphans: Compute Engine instances labelled as ours and as this installation's, and firewall rules whose
description carries the same marks (a firewall rule takes no labels), that no stack's state holds.

The queries are the Compute API's `instances.aggregatedList` (every zone of the entry's project) and
`firewalls.list`, each with a server-side filter built here (`instances_filter`, `firewalls_filter`); the
marks are checked again on each answer. An item's id is its selfLink from `projects/` on, the id the gcp
provider keeps in the state. No cloud runs here: the filters, the paging and the comparison are unit-tested
with recorded-shape answers (tests/pools/test_orphans_gcp.py); `HttpCompute` has never met the real API.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from automation.orphans.model import Orphan
from stacks.marks import (
    GCP_INSTALLATION,
    GCP_MANAGED_BY,
    MANAGED_BY,
    WORD_INSTALLATION,
    WORD_MANAGED_BY,
    carries_installation,
    gcp_value,
    word_value,
)

COMPUTE = "https://compute.googleapis.com/compute/v1/"
INSTANCE_TYPE = "gcp:compute/instance:Instance"
FIREWALL_TYPE = "gcp:compute/firewall:Firewall"
TOKEN_ENV = "GOOGLE_OAUTH_ACCESS_TOKEN"
METADATA_TOKEN = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"


class ComputeApi(Protocol):
    """GET and DELETE on a path under the Compute API v1 (`projects/...`); answers as JSON objects."""

    def get(self, path: str, params: dict[str, str]) -> dict[str, Any]: ...

    def delete(self, path: str) -> None: ...


def instances_filter(installation: str) -> str:
    ours = f'labels.{GCP_MANAGED_BY} = "{MANAGED_BY}"'
    return f'{ours} AND labels.{GCP_INSTALLATION} = "{gcp_value(installation)}"'


def firewalls_filter(installation: str) -> str:
    """The `eq` form (an RE2 full match on the field): a description with both marks."""
    marks = [f"{WORD_MANAGED_BY}={MANAGED_BY}", f"{WORD_INSTALLATION}={word_value(installation)}"]
    return "description eq " + json.dumps(".*" + ".*".join(re.escape(m) + r"(\s.*)?" for m in marks))


def resource_id(self_link: str) -> str:
    """`projects/...` from a selfLink: the id the provider stores."""
    return self_link[self_link.index("projects/") :]


def pages(api: ComputeApi, path: str, params: dict[str, str]) -> Iterator[dict[str, Any]]:
    token = ""
    while True:
        answer = api.get(path, params | ({"pageToken": token} if token else {}))
        yield answer
        token = answer.get("nextPageToken") or ""
        if not token:
            return


def labelled_instances(api: ComputeApi, *, project: str, installation: str) -> list[dict[str, Any]]:
    params = {"filter": instances_filter(installation)}
    found = []
    for page in pages(api, f"projects/{project}/aggregated/instances", params):
        for scoped in (page.get("items") or {}).values():
            found += [item for item in scoped.get("instances") or () if _labelled(item, installation)]
    return found


def described_firewalls(api: ComputeApi, *, project: str, installation: str) -> list[dict[str, Any]]:
    params = {"filter": firewalls_filter(installation)}
    return [
        item
        for page in pages(api, f"projects/{project}/global/firewalls", params)
        for item in page.get("items") or ()
        if carries_installation(item.get("description") or "", installation)
    ]


def _labelled(item: dict[str, Any], installation: str) -> bool:
    labels = item.get("labels") or {}
    ours = labels.get(GCP_MANAGED_BY) == MANAGED_BY
    return ours and labels.get(GCP_INSTALLATION) == gcp_value(installation)


def gcp_orphans(
    api: ComputeApi, *, provider: str, project: str, installation: str, known: set[tuple[str, str]]
) -> list[Orphan]:
    orphans = []
    for item in labelled_instances(api, project=project, installation=installation):
        key = resource_id(item["selfLink"])
        if (INSTANCE_TYPE, key) not in known:
            zone = str(item.get("zone", "")).rsplit("/", 1)[-1]
            orphans.append(Orphan(provider, "instance", key, f"instance {item['name']} in {zone}", name=key))
    for item in described_firewalls(api, project=project, installation=installation):
        key = resource_id(item["selfLink"])
        if (FIREWALL_TYPE, key) not in known:
            orphans.append(Orphan(provider, "firewall", key, f"firewall {item['name']}", name=key))
    return orphans


def delete_gcp(api: ComputeApi, orphan: Orphan) -> bool:
    """Ask Compute Engine to delete it (the operation runs on there; not waited for)."""
    api.delete(orphan.name)
    return True


@dataclass
class HttpCompute:
    """The Compute API over HTTPS with a bearer token: $GOOGLE_OAUTH_ACCESS_TOKEN (for example from
    `gcloud auth print-access-token`), else the metadata server's (workload identity, a GCE/GKE node).
    A service-account key file is not read here: signing its JWT needs a crypto library we do not ship."""

    token: str = field(default_factory=lambda: access_token(), repr=False)
    timeout: float = 30.0

    def get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        import httpx  # here, not at the top: `serve` imports this module (the CLI) and never calls it

        answer = httpx.get(COMPUTE + path, params=params, headers=self._headers(), timeout=self.timeout)
        answer.raise_for_status()
        return dict(answer.json())

    def delete(self, path: str) -> None:
        import httpx

        httpx.delete(COMPUTE + path, headers=self._headers(), timeout=self.timeout).raise_for_status()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def access_token() -> str:
    token = os.environ.get(TOKEN_ENV)
    if token:
        return token
    import httpx

    try:
        answer = httpx.get(METADATA_TOKEN, headers={"Metadata-Flavor": "Google"}, timeout=5)
        answer.raise_for_status()
        return str(answer.json()["access_token"])
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise RuntimeError(
            f"no access token for the Compute API: set {TOKEN_ENV} (gcloud auth print-access-token) or run "
            "where the metadata server answers"
        ) from exc
