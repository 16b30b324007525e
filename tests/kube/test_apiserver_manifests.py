"""Against a real kube-apiserver: crds/ installs, examples/ and deploy/ apply server-side, and the CRD refuses
what the models refuse (and accepts what they accept).

Every mistake is applied as a dry run, so nothing of it is stored. test_crd_rules_matter.py shows that each
refusal comes from the part of the CRD the mistake names.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import DynamicApiError
from pydantic import ValidationError

from stacks.models import Proxy
from tests.kube.apiserver import ROOT
from tests.kube.manifests import (
    CRD_KIND,
    Document,
    apply,
    kube_documents,
    namespaces_first,
    refusal,
)
from tests.kube.mistakes import ACCEPTED, MISTAKES, Mistake, proxy

CRD_FILES = sorted((ROOT / "crds").glob("*.yaml"))
SOURCES = sorted([*ROOT.glob("examples/**/*.y*ml"), *ROOT.glob("deploy/**/*.yaml")])
OBJECTS = kube_documents(SOURCES)
PROXIES = [(path, d) for path, d in OBJECTS if d["kind"] == "Proxy"]


def ident(path: Path, document: Document) -> str:
    meta = document["metadata"]
    return f"{path.relative_to(ROOT)}:{document['kind']}/{meta.get('namespace', '')}/{meta['name']}"


@pytest.fixture(scope="module")
def applied(dynamic: DynamicClient) -> dict[str, Document | str]:
    """Every object of examples/ and deploy/, applied namespaces first: the stored object or the refusal."""
    by_id = {id(document): ident(path, document) for path, document in OBJECTS}
    results: dict[str, Document | str] = {}
    for document in namespaces_first([d for _, d in OBJECTS]):
        key = by_id.get(id(document), f"implied:{document['metadata']['name']}")
        try:
            results[key] = apply(dynamic, document)
        except DynamicApiError as exc:
            results[key] = refusal(exc)
    return results


def test_sources_hold_the_objects_we_expect() -> None:
    kinds = {d["kind"] for _, d in OBJECTS}
    assert {"Proxy", "ConfigMap", "Secret", "Namespace", "Deployment", "ServiceAccount"} <= kinds
    assert len(PROXIES) >= 8


@pytest.mark.parametrize("path", CRD_FILES, ids=lambda p: p.name)
def test_every_crd_is_established(dynamic: DynamicClient, path: Path) -> None:
    resource = dynamic.resources.get(api_version=CRD_KIND[0], kind=CRD_KIND[1])
    for document in yaml.safe_load_all(path.read_text()):
        crd = dynamic.get(resource, name=document["metadata"]["name"]).to_dict()
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions["Established"] == conditions["NamesAccepted"] == "True"


@pytest.mark.parametrize(("path", "document"), OBJECTS, ids=[ident(p, d) for p, d in OBJECTS])
def test_applies_server_side(applied: dict[str, Document | str], path: Path, document: Document) -> None:
    result = applied[ident(path, document)]
    assert isinstance(result, dict), f"the apiserver refused it: {result}"
    assert result["metadata"]["name"] == document["metadata"]["name"]
    assert any(f["manager"] == "proxy-operator-tests" for f in result["metadata"]["managedFields"])


@pytest.mark.parametrize(("path", "document"), PROXIES, ids=[ident(p, d) for p, d in PROXIES])
def test_example_proxies_both_accept(
    applied: dict[str, Document | str], path: Path, document: Document
) -> None:
    stored = applied[ident(path, document)]
    assert isinstance(stored, dict), f"the apiserver refused it: {stored}"
    # The apiserver's defaults and the model's agree: the stored object reads as the manifest does.
    assert Proxy.model_validate(stored).spec == Proxy.model_validate(document).spec


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.id)
def test_mistakes_are_refused_by_the_apiserver_and_the_model(
    dynamic: DynamicClient, mistake: Mistake
) -> None:
    document = mistake.document()
    with pytest.raises(DynamicApiError) as refused:
        apply(dynamic, document, dry_run=True)
    message = refusal(refused.value)
    assert refused.value.status == mistake.status, message
    assert mistake.says in message
    with pytest.raises(ValidationError):
        Proxy.model_validate(document)


def test_an_unknown_field_is_pruned_by_a_create_unless_strict(dynamic: DynamicClient) -> None:
    """What a client that does not apply server-side meets: the typo is dropped with a warning, or refused."""
    resource = dynamic.resources.get(api_version="crawl.example.com/v1alpha1", kind="Proxy")
    document = proxy({"prot": 3128})
    created = dynamic.create(resource, body=document, namespace="default", dry_run="All").to_dict()
    assert "prot" not in created["spec"]
    strict = [("fieldValidation", "Strict")]
    with pytest.raises(DynamicApiError) as refused:
        dynamic.create(resource, body=document, namespace="default", dry_run="All", query_params=strict)
    assert refused.value.status == 400
    assert 'unknown field "spec.prot"' in refusal(refused.value)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_edge_cases_both_accept(dynamic: DynamicClient, name: str) -> None:
    document = ACCEPTED[name]
    stored = apply(dynamic, document, dry_run=True)
    assert Proxy.model_validate(stored).spec == Proxy.model_validate(document).spec
