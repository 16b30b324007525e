"""The directory source: what a folder of manifests turns into, and the deletion lifecycle."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

from service.sources.directory import DirectorySource

CATALOGUE = {"providers": [{"name": "local", "type": "local"}]}


def proxy(name: str, port: int = 3128) -> dict:
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": "crawl"},
        "spec": {"provider": "local", "port": port, "allowedSourceRanges": ["127.0.0.0/8"]},
    }


def write(path: Path, *docs: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(docs))
    os.utime(path, ns=(time.time_ns(), time.time_ns()))


def source(tmp_path: Path) -> DirectorySource:
    return DirectorySource(tmp_path, now=lambda: datetime(2026, 1, 1, tzinfo=UTC))


def settled(src: DirectorySource):
    """A change is acted on once the folder held still for one poll: the first poll only notes it."""
    assert src.poll().empty, "a change must not be acted on at the poll that first sees it"
    return src.poll()


def test_removed_proxy_becomes_deleting_until_released(tmp_path: Path) -> None:
    write(tmp_path / "catalogue.yaml", CATALOGUE)
    write(tmp_path / "a.yaml", proxy("a"))
    write(tmp_path / "b.yaml", proxy("b"))
    src = source(tmp_path)
    first = src.poll()
    assert first.catalogue is not None
    assert sorted(p.key for p in first.upserts) == ["crawl/a", "crawl/b"]
    assert src.poll().empty, "nothing changed, nothing reported"

    (tmp_path / "a.yaml").unlink()
    change = settled(src)
    assert change.complete
    assert change.upserts == []
    [leaving] = change.deletions
    assert leaving.key == "crawl/a"
    assert leaving.metadata.deletion_timestamp == datetime(2026, 1, 1, tzinfo=UTC)
    assert "crawl/a" in {p.key for p in src.proxies()}, "kept until its resources are gone"
    src.release("crawl/a")
    assert sorted(p.key for p in src.proxies()) == ["crawl/b"]


def test_broken_documents_keep_what_was_there(tmp_path: Path) -> None:
    write(tmp_path / "catalogue.yaml", CATALOGUE)
    write(tmp_path / "a.yaml", proxy("a"))
    src = source(tmp_path)
    src.poll()
    broken = proxy("a", port=70000)
    write(tmp_path / "a.yaml", broken)
    (tmp_path / "catalogue.yaml").write_text("providers: [{name: Local_Bad, type: local}]\n")
    change = settled(src)
    assert change.upserts == [], "an unparsable Proxy is not a deleted Proxy"
    assert change.deletions == []
    assert change.held["crawl/a"].reason == "InvalidSpec"
    assert "spec.port" in change.held["crawl/a"].message
    assert change.catalogue is None, "a broken catalogue keeps the previous one"
    assert src.catalogue is not None
    assert src.catalogue.names() == ["local"]
    assert any("spec.port" in str(p) for p in change.problems)


def test_hidden_paths_of_a_mounted_configmap_are_ignored(tmp_path: Path) -> None:
    # kubelet mounts a ConfigMap as timestamped copies in ..<time>/ plus links; only the visible file counts.
    write(tmp_path / "..2026_01_01_00_00_00.1" / "providers.yaml", CATALOGUE)
    write(tmp_path / "providers.yaml", CATALOGUE)
    write(tmp_path / "a.yaml", proxy("a"))
    change = source(tmp_path).poll()
    assert change.problems == []
    assert change.catalogue is not None


def test_secrets_beside_the_manifests(tmp_path: Path) -> None:
    write(tmp_path / "catalogue.yaml", CATALOGUE)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "auth", "namespace": "crawl"},
        "data": {"username": "dXNlcg=="},
        "stringData": {"password": "pw"},
    }
    doc = proxy("a")
    doc["spec"]["auth"] = {"mode": "secret", "secretRef": {"name": "auth"}}
    write(tmp_path / "a.yaml", doc, secret)
    src = source(tmp_path)
    [found] = src.poll().upserts
    assert src.credentials_for(found) == {"username": "user", "password": "pw"}
    assert src.secret_value("auth", "password") == "pw"
    assert src.secret_value("auth", "missing") is None


def test_a_folder_in_motion_is_not_acted_on(tmp_path: Path) -> None:
    write(tmp_path / "catalogue.yaml", CATALOGUE)
    write(tmp_path / "a.yaml", proxy("a"))
    src = source(tmp_path)
    src.poll()
    (tmp_path / "a.yaml").unlink()  # a `git pull` half way: the file is gone for a moment...
    assert src.poll().empty
    write(tmp_path / "a.yaml", proxy("a"))  # ...and back, before the folder ever held still without it
    assert src.poll().empty
    assert src.poll().empty, "same content: nothing to do, and nothing was deleted"
    assert [p.metadata.deletion_timestamp for p in src.proxies()] == [None]


def test_no_catalogue_reconciles_nothing(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", proxy("a"))
    src = source(tmp_path)
    change = src.poll()
    assert src.catalogue is None
    assert change.catalogue is None
    assert any("no provider catalogue" in p.message for p in change.problems)


def test_an_undecodable_secret_is_reported_and_blocks_nothing(tmp_path: Path) -> None:
    write(tmp_path / "catalogue.yaml", CATALOGUE)
    bad = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "bad", "namespace": "crawl"},
        "data": {"password": "not base64!"},
    }
    write(tmp_path / "a.yaml", proxy("a"), bad)
    src = source(tmp_path)
    change = src.poll()
    assert [p.key for p in change.upserts] == ["crawl/a"]
    [problem] = change.problems
    assert problem.obj == "Secret crawl/bad"
    assert "stringData" in problem.message
    assert src.secret_value("bad", "password") is None


# --- the source contract: only a complete read declares deletions ------------------------------------------


def test_a_file_that_stops_parsing_holds_every_proxy_it_held(tmp_path: Path) -> None:
    write(tmp_path / "catalogue.yaml", CATALOGUE)
    write(tmp_path / "proxies.yaml", proxy("a"), proxy("b"))
    write(tmp_path / "c.yaml", proxy("c"))
    src = source(tmp_path)
    assert src.poll().complete
    (tmp_path / "proxies.yaml").write_text("kind: Proxy\nmetadata: {name: a\n")  # a YAML syntax error
    (tmp_path / "c.yaml").unlink()  # ...and a removal in the same change: not declared either
    change = settled(src)
    assert not change.complete
    assert change.deletions == [], "an incomplete read declares no deletion at all"
    assert {k: h.reason for k, h in change.held.items()} == {
        "crawl/a": "ManifestUnreadable",
        "crawl/b": "ManifestUnreadable",
        "crawl/c": "ManifestUnreadable",  # it may have moved into the file that cannot be read
    }
    assert "proxies.yaml" in change.held["crawl/a"].message
    assert all(p.metadata.deletion_timestamp is None for p in src.proxies())

    write(tmp_path / "proxies.yaml", proxy("a"), proxy("b"))  # fixed: now c's removal is declared
    change = settled(src)
    assert change.complete
    assert [p.key for p in change.deletions] == ["crawl/c"]
    assert change.held == {}


def test_an_emptied_or_catalogue_less_folder_declares_nothing(tmp_path: Path) -> None:
    write(tmp_path / "catalogue.yaml", CATALOGUE)
    write(tmp_path / "a.yaml", proxy("a"))
    src = source(tmp_path)
    src.poll()
    (tmp_path / "a.yaml").unlink()
    (tmp_path / "catalogue.yaml").unlink()
    change = settled(src)
    assert not change.complete
    assert change.deletions == []
    assert change.held["crawl/a"].reason == "NotDeclared"


def test_a_nameless_proxy_document_makes_the_read_incomplete(tmp_path: Path) -> None:
    write(tmp_path / "catalogue.yaml", CATALOGUE)
    write(tmp_path / "a.yaml", proxy("a"))
    src = source(tmp_path)
    src.poll()
    nameless = proxy("a")
    del nameless["metadata"]["name"]  # which Proxy is this? it could be `a`: never read it as deleted
    write(tmp_path / "a.yaml", nameless)
    change = settled(src)
    assert not change.complete
    assert change.deletions == []


def test_tracked_proxies_are_declared_deleted_only_by_a_complete_read(tmp_path: Path) -> None:
    """After a restart the source learns from the backend what runs; absence counts only when clean."""
    from stacks.models import Proxy

    write(tmp_path / "catalogue.yaml", CATALOGUE)
    write(tmp_path / "a.yaml", proxy("a"))
    write(tmp_path / "bad.yaml", "providers: [")
    src = source(tmp_path)
    assert not src.poll().complete
    src.track([Proxy.model_validate(proxy("gone"))])
    change = src.poll()  # nothing changed on disk: the tracked proxy is judged against the last read
    assert change.deletions == []
    assert change.held["crawl/gone"].reason == "NotDeclared"

    (tmp_path / "bad.yaml").unlink()
    change = settled(src)
    assert change.complete
    assert [p.key for p in change.deletions] == ["crawl/gone"]
    assert change.deletions[0].metadata.deletion_timestamp is not None


def test_a_tracked_proxy_that_is_declared_is_not_deleted(tmp_path: Path) -> None:
    from stacks.models import Proxy

    write(tmp_path / "catalogue.yaml", CATALOGUE)
    write(tmp_path / "a.yaml", proxy("a"))
    src = source(tmp_path)
    src.track([Proxy.model_validate(proxy("a"))])
    change = src.poll()
    assert [p.key for p in change.upserts] == ["crawl/a"]
    assert change.deletions == []
    assert src.poll().empty


def test_an_unreadable_file_is_a_file_level_problem(tmp_path: Path) -> None:
    import os as _os

    if _os.geteuid() == 0:
        # root reads any file whatever its mode: simulate with a file that is not UTF-8 instead
        write(tmp_path / "catalogue.yaml", CATALOGUE)
        write(tmp_path / "a.yaml", proxy("a"))
        src = source(tmp_path)
        src.poll()
        (tmp_path / "a.yaml").write_bytes(b"\xff\xfe\x00garbage")
    else:
        write(tmp_path / "catalogue.yaml", CATALOGUE)
        write(tmp_path / "a.yaml", proxy("a"))
        src = source(tmp_path)
        src.poll()
        (tmp_path / "a.yaml").chmod(0)
    change = settled(src)
    assert not change.complete
    assert change.deletions == []
    assert change.held["crawl/a"].reason == "ManifestUnreadable"


def test_a_misspelt_kind_holds_the_proxy_it_was_meant_to_be(tmp_path: Path) -> None:
    """`kind: proxy` (or a version or group of ours that does not exist) is not "no Proxy here": the read
    is unclean, so the Proxy that ran is held with the hint, never declared deleted."""
    for kind, api_version in [
        ("proxy", "crawl.example.com/v1alpha1"),
        ("Proxies", "crawl.example.com/v1alpha1"),
        ("Proxy", "crawl.example.com/v1"),
        ("Proxy", "crawl.example.con/v1alpha1"),
    ]:
        root = tmp_path / f"{kind}-{api_version.replace('/', '_')}"
        write(root / "catalogue.yaml", CATALOGUE)
        write(root / "a.yaml", proxy("a"))
        write(root / "b.yaml", proxy("b"))
        src = source(root)
        assert src.poll().complete
        write(root / "a.yaml", proxy("a") | {"kind": kind, "apiVersion": api_version})
        change = settled(src)
        assert not change.complete, (kind, api_version)
        assert change.deletions == [], f"{kind} {api_version}: a misspelt kind declared a deletion"
        assert change.held["crawl/a"].reason == "NotDeclared"
        assert "did you mean" in change.held["crawl/a"].message
        assert "a.yaml" in change.held["crawl/a"].message
        [problem] = change.problems
        assert "nothing is deleted until this is fixed" in problem.message
        assert all(p.metadata.deletion_timestamp is None for p in src.proxies())

        write(root / "a.yaml", proxy("a"))  # fixed: nothing was lost, nothing changes
        change = settled(src)
        assert change.complete
        assert (change.deletions, change.held) == ([], {})
