"""A document that looks like ours but is not exactly ours is a problem, never silently ignored.

A misspelt kind (`proxy`, `Proxies`, `ProxyPol`) or an unknown version or near-miss group used to read as
"no such Proxy here", so a complete read declared the Proxy it was meant to be deleted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from stacks.manifests import load_manifests

OURS = "crawl.example.com/v1alpha1"
CATALOGUE = {"providers": [{"name": "local", "type": "local"}]}


def doc(kind: str | None, api_version: str | None) -> dict:
    document: dict = {
        "metadata": {"name": "a", "namespace": "crawl"},
        "spec": {"provider": "local", "port": 3128, "allowedSourceRanges": ["127.0.0.0/8"]},
    }
    if api_version is not None:
        document["apiVersion"] = api_version
    if kind is not None:
        document["kind"] = kind
    return document


def load(tmp_path: Path, *documents: object):
    (tmp_path / "catalogue.yaml").write_text(yaml.safe_dump(CATALOGUE))
    (tmp_path / "a.yaml").write_text(yaml.safe_dump_all(documents))
    return load_manifests(tmp_path)


@pytest.mark.parametrize(
    ("kind", "api_version", "hint"),
    [
        ("proxy", OURS, 'did you mean "Proxy"?'),
        ("Proxies", OURS, 'did you mean "Proxy"?'),
        ("Proxys", OURS, 'did you mean "Proxy"?'),
        ("ProxyPol", OURS, 'did you mean "ProxyPool"?'),
        ("proxypool", OURS, 'did you mean "ProxyPool"?'),
        ("ProxyPools", OURS, 'did you mean "ProxyPool"?'),
        ("Gateway", OURS, "not a kind of crawl.example.com"),
        ("Proxy", "crawl.example.com/v1", "did you mean crawl.example.com/v1alpha1?"),
        ("ProxyPool", "crawl.example.com/v1beta1", "did you mean crawl.example.com/v1alpha1?"),
        ("Proxy", "crawl.example.con/v1alpha1", "did you mean crawl.example.com/v1alpha1?"),
        ("Proxy", "Crawl.example.com/v1alpha1", "did you mean crawl.example.com/v1alpha1?"),
        ("proxy", "v1", 'did you mean "Proxy" with apiVersion crawl.example.com/v1alpha1?'),
        ("Proxy", None, "did you mean apiVersion crawl.example.com/v1alpha1?"),
        (None, OURS, "has no kind"),
    ],
)
def test_a_near_miss_is_a_problem_with_a_hint(
    tmp_path: Path, kind: str | None, api_version: str | None, hint: str
) -> None:
    found = load(tmp_path, doc("Proxy", OURS) | {"metadata": {"name": "b"}}, doc(kind, api_version))
    [problem] = found.problems
    assert problem.obj == "document", "a problem of the whole document makes the read unclean"
    assert (problem.document, problem.file) == (1, str(tmp_path / "a.yaml"))
    assert hint in problem.message
    assert problem.message.endswith("nothing is deleted until this is fixed")
    assert "document 2" in str(problem)
    assert [p.obj.key for p in found.proxies] == ["default/b"]
    assert found.catalogue is not None


def test_the_message_names_what_was_found_and_the_fix(tmp_path: Path) -> None:
    [problem] = load(tmp_path, doc("proxy", OURS)).problems
    assert problem.message == (
        'kind "proxy" with apiVersion crawl.example.com/v1alpha1 is not a kind of crawl.example.com '
        '(did you mean "Proxy"?); nothing is deleted until this is fixed'
    )
    assert problem.line == 2, "points at the kind (safe_dump sorts the keys: apiVersion, kind, ...)"


UNRELATED = [
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "Service"),
    ("apps/v1", "Deployment"),
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
    ("kustomize.toolkit.fluxcd.io/v1", "Kustomization"),
    ("networking.istio.io/v1", "ProxyConfig"),
    ("policy/v1", "PodDisruptionBudget"),
    ("v1", "Pod"),
    ("rbac.authorization.k8s.io/v1", "Role"),
]


@given(st.sampled_from(UNRELATED))
@settings(max_examples=len(UNRELATED) * 3, deadline=None)
def test_documents_of_other_groups_stay_ignored(other: tuple[str, str]) -> None:
    from tempfile import TemporaryDirectory

    api_version, kind = other
    with TemporaryDirectory() as tmp:
        found = load(Path(tmp), {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}})
    assert found.problems == []
    assert len(found.ignored) == 1


def _edits(word: str) -> st.SearchStrategy[str]:
    """`word` with one or two random edits: insert, delete, substitute a letter, or swap two neighbours."""
    letters = st.sampled_from("abcdefghijklmnopqrstuvwxyzPXY")

    def one(draw_word: str) -> st.SearchStrategy[str]:
        i = st.integers(0, max(len(draw_word) - 1, 0))
        return st.one_of(
            st.tuples(i, letters).map(lambda t: draw_word[: t[0]] + t[1] + draw_word[t[0] :]),
            i.map(lambda n: draw_word[:n] + draw_word[n + 1 :]),
            st.tuples(i, letters).map(lambda t: draw_word[: t[0]] + t[1] + draw_word[t[0] + 1 :]),
            i.map(
                lambda n: draw_word[:n] + draw_word[n + 1 : n + 2] + draw_word[n : n + 1] + draw_word[n + 2 :]
            ),
        )

    return one(word).flatmap(lambda w: st.one_of(st.just(w), one(w)))


@given(
    kind=st.one_of(_edits("Proxy"), _edits("ProxyPool"), st.sampled_from(["PROXY", "pRoXy", "PROXYPOOL"])),
    api_version=st.sampled_from([OURS, "crawl.example.com/v1", "v1", "apps/v1", "example.org/v1", None]),
)
@settings(max_examples=300, deadline=None)
def test_any_kind_within_two_edits_of_ours_is_refused(kind: str, api_version: str | None) -> None:
    from tempfile import TemporaryDirectory

    if (kind, api_version) in (("Proxy", OURS), ("ProxyPool", OURS)) or not kind:
        return
    with TemporaryDirectory() as tmp:
        found = load(Path(tmp), doc(kind, api_version))
    assert [p.obj for p in found.problems] == ["document"], (kind, api_version)
    assert "nothing is deleted until this is fixed" in found.problems[0].message
    assert (found.proxies, found.pools) == ([], [])


def test_the_catalogue_is_still_recognised_in_both_shapes(tmp_path: Path) -> None:
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "providers"},
        "data": {"providers.yaml": yaml.safe_dump(CATALOGUE)},
    }
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(configmap))
    found = load_manifests(tmp_path)
    assert found.problems == []
    assert found.catalogue is not None
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(CATALOGUE))
    found = load_manifests(tmp_path)
    assert found.problems == []
    assert found.catalogue is not None


@pytest.mark.parametrize("kind", ["Configmap", "configMap", "ConfigMaps", "ConfgMap"])
def test_a_misspelt_catalogue_configmap_is_a_catalogue_problem(tmp_path: Path, kind: str) -> None:
    configmap = {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {"name": "providers"},
        "data": {"providers.yaml": yaml.safe_dump(CATALOGUE)},
    }
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(configmap))
    found = load_manifests(tmp_path)
    [problem] = found.problems
    assert problem.obj == "catalogue"
    assert 'did you mean "ConfigMap"?' in problem.message
    assert found.broken_catalogues == 1


def test_a_configmap_like_kind_without_the_catalogue_key_stays_ignored(tmp_path: Path) -> None:
    other = {"apiVersion": "v1", "kind": "Configmap", "metadata": {"name": "x"}, "data": {"a": "b"}}
    found = load(tmp_path, other)
    assert found.problems == []
