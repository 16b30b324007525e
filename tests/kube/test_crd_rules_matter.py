"""Each refusal of tests/kube/test_apiserver_manifests.py comes from the part of the CRD its mistake names.

Copies of the Proxy CRD are installed in other API groups: without its CEL rules, without any schema, and one
per CEL rule without that rule alone. A mistake said to be refused by a rule must pass the copy without it (so
removing that rule from the CRD makes its refusal test fail); one refused by the schema must pass only the
copy without a schema; one refused by the apiserver's own name rules passes neither.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import DynamicApiError

from tests.kube.apiserver import ROOT
from tests.kube.manifests import CRD_KIND, Document, apply, kube_documents, wait_established
from tests.kube.mistakes import MISTAKES, Mistake

NO_CEL, NO_SCHEMA = "no-cel.crawl.example.com", "no-schema.crawl.example.com"
OPEN = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def proxy_crd() -> Document:
    crds = kube_documents(sorted((ROOT / "crds").glob("*.yaml")))
    found = [d for _, d in crds if d["kind"] == CRD_KIND[1] and d["spec"]["names"]["kind"] == "Proxy"]
    assert len(found) == 1
    return found[0]


def schema_of(crd: Document) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def variant(group: str, schema: dict[str, Any]) -> Document:
    crd = copy.deepcopy(proxy_crd())
    crd["metadata"]["name"] = f"{crd['spec']['names']['plural']}.{group}"
    crd["spec"]["group"] = group
    crd["spec"]["names"].pop("shortNames", None)
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = schema
    return crd


def rules(node: Any) -> list[dict[str, str]]:
    """Every x-kubernetes-validations rule under `node`, in document order."""
    if isinstance(node, list):
        return [rule for item in node for rule in rules(item)]
    if not isinstance(node, dict):
        return []
    own = node.get("x-kubernetes-validations", [])
    return [*own, *(rule for k, v in node.items() if k != "x-kubernetes-validations" for rule in rules(v))]


def without(node: Any, drop: dict[str, str] | None = None) -> Any:
    """`node` without the rule `drop` (without every rule when None)."""
    if isinstance(node, list):
        return [without(item, drop) for item in node if drop is None or item != drop]
    if not isinstance(node, dict):
        return node
    out = {
        k: without(v, drop) for k, v in node.items() if not (drop is None and k == "x-kubernetes-validations")
    }
    return {k: v for k, v in out.items() if not (k == "x-kubernetes-validations" and v == [])}


RULES = rules(schema_of(proxy_crd()))


@pytest.fixture(scope="module")
def variants(dynamic: DynamicClient) -> Iterator[None]:
    """The CRD without its CEL rules (NO_CEL), without a schema (NO_SCHEMA), without each rule (rule-N)."""
    schema = schema_of(proxy_crd())
    crds = [
        variant(NO_CEL, without(schema)),
        variant(NO_SCHEMA, {"type": "object", "properties": {"spec": OPEN, "status": OPEN}}),
        *(variant(f"rule-{n}.crawl.example.com", without(schema, rule)) for n, rule in enumerate(RULES)),
    ]
    for crd in crds:
        apply(dynamic, crd)
    for crd in crds:
        wait_established(dynamic, crd["metadata"]["name"], timeout=30)
    yield
    resource = dynamic.resources.get(api_version=CRD_KIND[0], kind=CRD_KIND[1])
    for crd in crds:
        dynamic.delete(resource, name=crd["metadata"]["name"])


def accepted(dynamic: DynamicClient, document: Document) -> bool:
    try:
        apply(dynamic, document, dry_run=True)
    except DynamicApiError:
        return False
    return True


def test_the_crd_has_cel_rules() -> None:
    assert len(RULES) >= 7
    assert len({rule["message"] for rule in RULES}) == len(RULES)


@pytest.mark.usefixtures("variants")
@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.id)
def test_each_refusal_comes_from_what_it_names(dynamic: DynamicClient, mistake: Mistake) -> None:
    without_rules = accepted(dynamic, mistake.document(NO_CEL))
    without_schema = accepted(dynamic, mistake.document(NO_SCHEMA))
    expected = {"cel": (True, True), "schema": (False, True), "builtin": (False, False)}
    assert (without_rules, without_schema) == expected[mistake.refused_by]


@pytest.mark.usefixtures("variants")
@pytest.mark.parametrize("n", range(len(RULES)), ids=[r["message"][:40] for r in RULES])
def test_each_rule_has_mistakes_that_pass_without_it(dynamic: DynamicClient, n: int) -> None:
    mine = [m for m in MISTAKES if m.refused_by == "cel" and m.says in RULES[n]["message"]]
    assert mine, f"no mistake in tests/kube/mistakes.py exercises the rule {RULES[n]['rule']}"
    group = f"rule-{n}.crawl.example.com"
    assert [m.id for m in mine if not accepted(dynamic, m.document(group))] == []
