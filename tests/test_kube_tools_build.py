"""The suite beside a background `make kube-tools` (tests/kube_tools_build.py, scripts/test.sh): the tests
that need its programs run last and wait for it; a failed build fails them with the end of its log."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from tests.kube_tools_build import API, NODE, BackgroundBuild, needs, run_last, share


@dataclass
class FakeItem:
    name: str
    fixturenames: list[str] = field(default_factory=list)
    marked: bool = False

    def get_closest_marker(self, name: str) -> Any:
        return object() if self.marked and name == "kube_tools" else None


def items(*specs: FakeItem) -> list[pytest.Item]:
    return cast(list[pytest.Item], list(specs))


def test_the_tests_that_need_the_tools_move_to_the_end_the_node_ones_last() -> None:
    run = items(
        FakeItem("api", ["kube_api", "tmp_path"]),
        FakeItem("plain", ["tmp_path"]),
        FakeItem("node", ["kube_node", "kube_api"]),
        FakeItem("own-apiserver", marked=True),
        FakeItem("other"),
    )
    assert run_last(run) == 3
    assert [cast(FakeItem, i).name for i in run] == ["plain", "other", "api", "own-apiserver", "node"]
    assert [needs(i) for i in run] == [None, None, API, API, NODE]


def test_the_api_servers_part_is_read_from_its_own_status(tmp_path: Path) -> None:
    build = BackgroundBuild(tmp_path / "status", tmp_path / "log", api_status=tmp_path / "api")
    (tmp_path / "api").write_text("0\n")
    assert (build.wait(API, within=0.1), build.wait(NODE, within=0.1)) == (0, None)  # the node still builds
    (tmp_path / "status").write_text("0\n")
    assert build.wait(NODE) == 0


def test_a_running_build_is_waited_for_and_its_exit_code_read(tmp_path: Path) -> None:
    build = BackgroundBuild(tmp_path / "status", tmp_path / "log")
    assert build.exit_code() is None
    assert build.wait(within=0.1) is None  # still running: the caller moves its tests last
    timer = threading.Timer(1.0, lambda: (tmp_path / "status").write_text("0\n"))
    timer.start()
    assert build.wait() == 0
    timer.join()


def test_a_failed_build_is_told_with_the_end_of_its_log(tmp_path: Path) -> None:
    (tmp_path / "log").write_text("".join(f"line {i}\n" for i in range(100)) + "go build failed\n")
    (tmp_path / "status").write_text("2\n")
    build = BackgroundBuild(tmp_path / "status", tmp_path / "log")
    message = build.failure(build.wait() or 0)
    assert message.startswith("`make kube-tools` failed (exit 2)")
    assert message.rstrip().endswith("go build failed")
    assert "line 75" in message
    assert "  line 5\n" not in message  # only the last lines


def test_without_the_script_there_is_nothing_to_wait_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROXY_OPERATOR_KUBE_TOOLS_STATUS", raising=False)
    assert BackgroundBuild.from_env() is None


def test_the_two_shares_of_the_suite_are_the_node_tests_and_every_other() -> None:
    run = items(
        FakeItem("api", ["kube_api"]),
        FakeItem("node", ["kube_node", "kube_api"]),
        FakeItem("plain", ["tmp_path"]),
        FakeItem("pods", ["node_fleet", "kube_node"]),
    )
    node = list(run)
    assert [cast(FakeItem, i).name for i in share(node, NODE)] == ["api", "plain"]
    assert [cast(FakeItem, i).name for i in node] == ["node", "pods"]
    rest = list(run)
    assert [cast(FakeItem, i).name for i in share(rest, "rest")] == ["node", "pods"]
    assert [cast(FakeItem, i).name for i in rest] == ["api", "plain"]
    with pytest.raises(pytest.UsageError, match="expected 'node' or 'rest'"):
        share(list(run), "nodes")
