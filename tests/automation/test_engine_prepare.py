"""`Engine.prepare`: the CLI's version is read ahead, once, in a thread, without importing the SDK; the
first operation then makes no `pulumi version` call of its own. A stand-in CLI (a script that logs each
call) takes the place of Pulumi's: only its `version` answer matters here."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from automation.engine import Engine, EngineConfig
from tests.conftest import ROOT

FAKE = """#!/bin/sh
echo "$@" >> "{log}"
[ "$1" = version ] && echo v3.260.0
"""


def fake_cli(tmp_path: Path) -> tuple[Path, Path]:
    log, cli = tmp_path / "calls", tmp_path / "pulumi"
    cli.write_text(FAKE.format(log=log))
    cli.chmod(0o755)
    return cli, log


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_the_version_is_read_ahead_once_and_the_runner_takes_it(tmp_path: Path) -> None:
    cli, log = fake_cli(tmp_path)
    engine = Engine(EngineConfig(backend_url=(tmp_path / "b").as_uri(), state_dir=tmp_path, pulumi=cli))
    engine.prepare()
    engine.prepare()  # once
    deadline = time.monotonic() + 30
    while not calls(log) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert calls(log) == ["version"], "the version was not read ahead"
    runner = engine._command  # the first operation's runner
    assert str(runner.version) == "3.260.0"
    assert calls(log) == ["version"], "the runner read the version again"


def test_prepare_imports_no_sdk(tmp_path: Path) -> None:
    cli, log = fake_cli(tmp_path)
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from automation.engine import Engine, EngineConfig\n"
        f"config = EngineConfig(backend_url='file:///x', state_dir=Path({str(tmp_path)!r}), "
        f"pulumi=Path({str(cli)!r}))\n"
        "e = Engine(config)\n"
        "e.prepare(); e._runner._version.result(30)\n"
        "print(sorted(m for m in sys.modules if m == 'pulumi' or m.startswith('pulumi.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"
    assert calls(log) == ["version"]
