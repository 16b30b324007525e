"""CLI options and settings: an option given overrides the environment, a default never does; a bad value
(option or variable) ends in one line naming it and what it accepts, never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from service.cli import app
from service.cli_settings import command_settings
from service.serve import bind_listener
from tests.conftest import PulumiEnv


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "300", **(env or {})})


def one_error_line(result: Result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from a temporary folder, so a `.state` made by mistake lands there, not in the checkout."""
    monkeypatch.chdir(tmp_path)
    for name in ("PROXY_OPERATOR_STATE_DIR", "PROXY_OPERATOR_LISTEN_PORT", "PROXY_OPERATOR_LISTEN_HOST"):
        monkeypatch.delenv(name, raising=False)


# --- the environment holds unless an option is given ------------------------------------------------------


def test_an_option_left_out_keeps_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PROXY_OPERATOR_STATE_DIR", str(tmp_path / "from-env"))
    monkeypatch.setenv("PROXY_OPERATOR_LISTEN_PORT", "9191")
    settings = command_settings(state_dir=None, listen_host=None, listen_port=None)
    assert (settings.state_dir, settings.listen_port, settings.listen_host) == (
        tmp_path / "from-env",
        9191,
        "127.0.0.1",
    )


def test_an_option_given_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PROXY_OPERATOR_STATE_DIR", str(tmp_path / "from-env"))
    monkeypatch.setenv("PROXY_OPERATOR_LISTEN_PORT", "9191")
    settings = command_settings(state_dir=tmp_path / "given", listen_port=0)
    assert (settings.state_dir, settings.listen_port) == (tmp_path / "given", 0)


@pytest.mark.engine
def test_stacks_list_uses_the_state_dir_from_the_environment(pulumi_env: PulumiEnv, tmp_path: Path) -> None:
    from_env = tmp_path / "from-env"
    listed = invoke("stacks", "list", env={"PROXY_OPERATOR_STATE_DIR": str(from_env)})
    assert listed.exit_code == 0, listed.output
    assert (from_env / "work").is_dir()
    assert not (tmp_path / ".state").exists(), "the --state-dir default overrode PROXY_OPERATOR_STATE_DIR"

    given = tmp_path / "given"
    listed = invoke(
        "stacks", "list", "--state-dir", str(given), env={"PROXY_OPERATOR_STATE_DIR": str(from_env)}
    )
    assert listed.exit_code == 0, listed.output
    assert (given / "work").is_dir()


# --- a bad value: one line naming the option or the variable ----------------------------------------------
# `serve` runs in a child process with a deadline and an empty folder: were a bad value accepted, it would
# serve (nothing) until the deadline fails the test, instead of hanging it or provisioning proxies.


def serve(*args: str, manifests: Path, env: dict[str, str] | None = None) -> Result:
    command = [str(Path(sys.executable).parent / "proxy-operator"), "serve", "--manifests", str(manifests)]
    try:
        done = subprocess.run(
            [*command, *args],
            env={**os.environ, "COLUMNS": "300", **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"serve {' '.join(args)} started instead of refusing: {exc.stdout!r}") from exc
    return Result(
        runner=CliRunner(),
        stdout_bytes=done.stdout.encode(),
        stderr_bytes=done.stderr.encode(),
        output_bytes=(done.stdout + done.stderr).encode(),
        return_value=None,
        exit_code=done.returncode,
        exception=None,
    )


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    folder = tmp_path / "empty"
    folder.mkdir()
    return folder


@pytest.mark.parametrize(
    ("port", "accepts"),
    [("70000", "less than or equal to 65535"), ("-1", "greater than or equal to 0")],
)
def test_a_port_out_of_range_names_the_option(port: str, accepts: str, empty: Path) -> None:
    line = one_error_line(serve("--port", port, manifests=empty))
    assert line == f"error: --port: Input should be {accepts} (got {port})"


def test_a_port_variable_out_of_range_names_the_variable(empty: Path) -> None:
    line = one_error_line(serve(manifests=empty, env={"PROXY_OPERATOR_LISTEN_PORT": "99999"}))
    assert (
        line == "error: PROXY_OPERATOR_LISTEN_PORT: Input should be less than or equal to 65535 (got '99999')"
    )


def test_serve_without_a_mode_says_which_to_give(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "PROXY_OPERATOR_KUBE"))}
    command = [str(Path(sys.executable).parent / "proxy-operator"), "serve", "--port", "0"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert done.stderr.splitlines() == [
        "error: --manifests / --kubeconfig: give --manifests FOLDER (folder mode) or --kubeconfig FILE "
        "(in-cluster mode against that cluster); in a pod the in-cluster mode needs neither"
    ]


def test_serve_with_a_broken_kubeconfig_is_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    command = [str(Path(sys.executable).parent / "proxy-operator"), "serve", "--port", "0"]
    done = subprocess.run(
        [*command, "--kubeconfig", str(broken)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 2, done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: cannot configure the Kubernetes client from kubeconfig {broken}: ")


def test_a_port_in_use_is_one_line(empty: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_error_line(serve("--port", str(port), manifests=empty))
    assert line.startswith(f"error: --host/--port: cannot listen on 127.0.0.1:{port}: ")
    assert "in use" in line


def test_the_api_socket_accepts_connections_once_bound() -> None:
    """`serve` prints its address after binding and before uvicorn starts: a client that connects at once
    must be queued, not refused (a bench lost its service to the refusal)."""
    listener = bind_listener("127.0.0.1", 0)
    try:
        with socket.create_connection(listener.getsockname()[:2], timeout=5):
            pass
    finally:
        listener.close()


@pytest.mark.parametrize(
    ("variable", "value", "accepts"),
    [
        ("PROXY_OPERATOR_MAX_PARALLEL", "0", "greater than or equal to 1"),
        ("PROXY_OPERATOR_HEALTH_JITTER", "0.9", "less than or equal to 0.5"),
        ("PROXY_OPERATOR_DISCOVERY_MAX_WAIT_SECONDS", "31", "less than or equal to 30"),
        ("PROXY_OPERATOR_POLL_SECONDS", "often", "a valid number"),
    ],
)
def test_a_bad_variable_names_the_variable(variable: str, value: str, accepts: str) -> None:
    line = one_error_line(invoke("stacks", "list", env={variable: value}))
    assert line.startswith(f"error: {variable}: Input should be")
    assert accepts in line
    assert f"(got '{value}')" in line


def test_a_rule_across_settings_is_one_line_too(empty: Path) -> None:
    result = invoke("up", "--manifests", str(empty), env={"PROXY_OPERATOR_DISCOVERY_STORE": "redis"})
    line = one_error_line(result)
    assert line.startswith("error: PROXY_OPERATOR_DISCOVERY_*: store=redis needs redis_url")


def test_a_missing_pulumi_cli_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-pulumi"
    line = one_error_line(invoke("stacks", "list", env={"PROXY_OPERATOR_PULUMI_PATH": str(missing)}))
    assert line == f"error: PROXY_OPERATOR_PULUMI_PATH: {missing} is not an executable file"
