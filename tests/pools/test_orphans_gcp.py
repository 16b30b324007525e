"""gcp orphans: the Compute API queries and the comparison with the state, on recorded-shape answers.

No cloud runs here: `FakeCompute` answers `instances.aggregatedList` and `firewalls.list` as the API does
(items keyed by zone, pages by `nextPageToken`) and records each request, so the filters sent, the paging,
the marks checked again on each item and the state comparison are what is tested; `HttpCompute` itself has
never met the real API.
"""

from __future__ import annotations

from typing import Any

from automation.orphans.gcp import (
    FIREWALL_TYPE,
    INSTANCE_TYPE,
    delete_gcp,
    firewalls_filter,
    gcp_orphans,
    instances_filter,
)

PROJECT = "crawl-proj"
BASE = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}"
OURS = {"managed-by": "proxy-operator", "installation": "install-1"}


def _instance(name: str, zone: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "zone": f"{BASE}/zones/{zone}",
        "labels": labels,
        "selfLink": f"{BASE}/zones/{zone}/instances/{name}",
    }


def _firewall(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "description": description, "selfLink": f"{BASE}/global/firewalls/{name}"}


class FakeCompute:
    def __init__(self, answers: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.answers = answers  # (path, pageToken) -> answer
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.deleted: list[str] = []

    def get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        self.requests.append((path, params))
        return self.answers[(path, params.get("pageToken", ""))]

    def delete(self, path: str) -> None:
        self.deleted.append(path)


def _api() -> FakeCompute:
    instances = f"projects/{PROJECT}/aggregated/instances"
    firewalls = f"projects/{PROJECT}/global/firewalls"
    return FakeCompute(
        {
            (instances, ""): {
                "items": {
                    "zones/europe-west1-b": {"instances": [_instance("px-crawl-a", "europe-west1-b", OURS)]},
                    "zones/us-east1-c": {"warning": {"code": "NO_RESULTS_ON_PAGE"}},
                },
                "nextPageToken": "p2",
            },
            (instances, "p2"): {
                "items": {
                    "zones/europe-west1-c": {
                        "instances": [
                            _instance("px-crawl-b", "europe-west1-c", OURS),  # held by a stack
                            # the filter is the server's; an item without our marks is still refused
                            _instance("px-other", "europe-west1-c", {**OURS, "installation": "install-2"}),
                        ]
                    }
                }
            },
            (firewalls, ""): {
                "items": [
                    _firewall(
                        "px-crawl-a-v4",
                        "proxy-operator: proxy crawl/a; managed-by=proxy-operator "
                        "installation=install-1 stack=gcp-eu",
                    ),
                    _firewall("px-other-v4", "managed-by=proxy-operator installation=install-2"),
                ]
            },
        }
    )


def test_lists_this_installations_instances_and_firewalls_that_no_state_holds() -> None:
    api = _api()
    known = {(INSTANCE_TYPE, f"projects/{PROJECT}/zones/europe-west1-c/instances/px-crawl-b")}
    found = gcp_orphans(api, provider="gcp-eu", project=PROJECT, installation="install-1", known=known)

    assert [(o.kind, o.id) for o in found] == [
        ("instance", f"projects/{PROJECT}/zones/europe-west1-b/instances/px-crawl-a"),
        ("firewall", f"projects/{PROJECT}/global/firewalls/px-crawl-a-v4"),
    ]
    sent = {path: params["filter"] for path, params in api.requests}
    assert sent[f"projects/{PROJECT}/aggregated/instances"] == (
        'labels.managed-by = "proxy-operator" AND labels.installation = "install-1"'
    )
    assert sent[f"projects/{PROJECT}/global/firewalls"] == firewalls_filter("install-1")
    assert [params.get("pageToken") for _, params in api.requests[:2]] == [None, "p2"]


def test_held_by_a_state_nothing_is_listed_and_delete_names_the_resource() -> None:
    api = _api()
    known = {
        (INSTANCE_TYPE, f"projects/{PROJECT}/zones/europe-west1-b/instances/px-crawl-a"),
        (INSTANCE_TYPE, f"projects/{PROJECT}/zones/europe-west1-c/instances/px-crawl-b"),
        (FIREWALL_TYPE, f"projects/{PROJECT}/global/firewalls/px-crawl-a-v4"),
    }
    assert gcp_orphans(api, provider="gcp-eu", project=PROJECT, installation="install-1", known=known) == []

    [orphan, *_] = gcp_orphans(api, provider="gcp-eu", project=PROJECT, installation="install-1", known=set())
    assert delete_gcp(api, orphan)
    assert api.deleted == [f"projects/{PROJECT}/zones/europe-west1-b/instances/px-crawl-a"]


def test_the_filters_name_our_marks_in_the_apis_syntax() -> None:
    assert instances_filter("Install 1") == (
        'labels.managed-by = "proxy-operator" AND labels.installation = "install_1"'
    )
    # `eq` is an RE2 full match on the field: both marks anywhere in the description, as whole words.
    assert firewalls_filter("install-1") == (
        r'description eq ".*managed\\-by=proxy\\-operator(\\s.*)?.*installation=install\\-1(\\s.*)?"'
    )
