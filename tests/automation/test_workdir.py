"""A stack's `Pulumi.yaml` is never seen half-written while workspaces for the stack are made beside a reader
(in CI the term's first read of the backend got "expected project to be an object, was '<nil>'" from the CLI:
the reconciler's workspace had just truncated the file). The real SDK's LocalWorkspace and Pulumi CLI."""

from __future__ import annotations

import threading
from pathlib import Path

import yaml

from automation.engine import Engine, EngineConfig
from automation.engine.workdir import write_project_file

READS = 150  # reads of the file made while both makers are making workspaces


def test_workspaces_made_side_by_side_never_show_a_reader_an_empty_project_file(tmp_path: Path) -> None:
    engine = Engine(EngineConfig(backend_url=f"file://{tmp_path / 'backend'}", state_dir=tmp_path / "state"))
    engine._workspace("local")  # the file exists from here on
    path = tmp_path / "state" / "work" / "local" / "Pulumi.yaml"
    read_enough, seen = threading.Event(), []

    def read() -> None:
        try:
            while len(seen) < READS:
                seen.append(yaml.safe_load(path.read_text()))
        finally:
            read_enough.set()  # a reader that failed stops the makers too (the count below says so)

    def make() -> None:
        # Each maker makes at least 150 workspaces, and goes on until the reader has read READS times: a
        # busy machine slows the reader, and before, 300 workspaces could end with 87 reads made.
        made = 0
        while made < 150 or not read_enough.is_set():
            engine._workspace("local")
            made += 1

    reader = threading.Thread(target=read)
    makers = [threading.Thread(target=make) for _ in range(2)]
    reader.start()
    for maker in makers:
        maker.start()
    reader.join()
    for maker in makers:
        maker.join()
    assert len(seen) == READS
    assert all(isinstance(project, dict) and project["name"] for project in seen), [
        s for s in seen if not isinstance(s, dict)
    ][:3]
    assert sorted(p.name for p in path.parent.iterdir()) == ["Pulumi.yaml"]  # no temporary left behind


def test_an_unchanged_project_file_is_not_written_again(tmp_path: Path) -> None:
    settings = {"name": "p", "runtime": "python", "main": "/x", "backend": {"url": "file:///b"}}
    path = write_project_file(tmp_path, settings)
    before = path.stat().st_ino
    write_project_file(tmp_path, settings)
    assert path.stat().st_ino == before
    write_project_file(tmp_path, {**settings, "main": "/y"})
    assert path.stat().st_ino != before
    assert yaml.safe_load(path.read_text())["main"] == "/y"
