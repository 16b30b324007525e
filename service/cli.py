"""The `proxy-operator` command line: each command parses options and calls a function the tests call."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from service.cli_orphans import orphans
from service.cli_settings import command_settings, setup_errors
from service.cli_stacks import preview_command, stacks_app
from service.kube.client import KubeClientError, in_cluster
from service.kube.settings import KubeSettings
from service.logging_setup import configure_logging
from service.memory import limit_arenas
from service.runner import apply_once
from service.serve import build_service, token_hint
from service.serve import run as run_service
from service.validate import validate_manifests

app = typer.Typer(no_args_is_help=True, help="Run and inspect a fleet of forward proxies for crawlers.")


@app.callback()
def main() -> None:
    """proxy-operator: Proxy objects in, one Pulumi stack per provider, a discovery API out."""


# Options shared by the commands that read a manifests folder.
Manifests = Annotated[
    Path,
    typer.Option(
        "--manifests", exists=True, file_okay=False, help="Folder of Proxy manifests and one catalogue."
    ),
]
# Options default to None: only an option given overrides the settings (PROXY_OPERATOR_*, then defaults).
StateDir = Annotated[
    Path | None,
    typer.Option("--state-dir", help="Work dirs, and the default file backend. [default: .state]"),
]

app.add_typer(stacks_app, name="stacks")
app.command("preview")(preview_command)
app.command("orphans")(orphans)


@app.command()
def validate(
    manifests: Manifests,
) -> None:
    """Check Proxies and the provider catalogue; exit 1 listing every problem."""
    report = validate_manifests(manifests)
    for problem in report.problems:
        typer.echo(str(problem))
    typer.echo(report.summary())
    raise typer.Exit(0 if report.ok else 1)


@app.command()
def up(
    manifests: Manifests,
    state_dir: StateDir = None,
    allow_deletions: list[str] | None = typer.Option(
        None,
        "--allow-deletions",
        metavar="CHANGE_ID",
        help="Let a change that the deletion budget stopped go ahead, once (its id is in the message).",
    ),
) -> None:
    """Apply the manifests once (every stack they change or empty) and exit: for a GitOps job."""
    configure_logging()
    settings = command_settings(state_dir=state_dir)
    with setup_errors():
        report = asyncio.run(apply_once(settings, manifests, allow_deletions=allow_deletions or ()))
    for line in report.problem_lines():
        typer.echo(line, err=True)
    for line in report.address_lines():
        typer.echo(line)
    raise typer.Exit(0 if report.ok else 1)


@app.command()
def serve(
    manifests: Annotated[
        Path | None,
        typer.Option(
            "--manifests",
            exists=True,
            file_okay=False,
            help="Folder mode: a folder of Proxy manifests and one catalogue. Always wins over the cluster.",
        ),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig",
            exists=True,
            dir_okay=False,
            help="In-cluster mode against this cluster (in a pod: its ServiceAccount, no option).",
        ),
    ] = None,
    state_dir: StateDir = None,
    host: str | None = typer.Option(None, "--host", help="Address the API listens on. [default: 127.0.0.1]"),
    port: int | None = typer.Option(
        None, "--port", help="Port of the API; 0: any free port. [default: 8080]"
    ),
    json_logs: bool = typer.Option(False, "--json-logs", help="One JSON object per log line."),
) -> None:
    """Reconcile Proxies and keep watching them; health-check the proxies; serve the API.

    The mode: `--manifests` (a folder) always wins; else `--kubeconfig`, or a pod's ServiceAccount, picks
    the in-cluster mode (Proxy objects, leader election, status and events in the cluster)."""
    limit_arenas()  # before any thread: see service/memory.py
    configure_logging(as_json=json_logs)
    settings = command_settings(state_dir=state_dir, listen_host=host, listen_port=port)
    with setup_errors():
        kube = pick_mode(manifests, kubeconfig)
        service = build_service(settings, manifests, kube=kube)
    url = f"http://{settings.listen_host}:{service.port}"
    mode = f"folder {manifests}" if manifests is not None else "in-cluster"
    typer.echo(f"serving on {url} ({mode}; token: {token_hint(settings)}); Ctrl-C stops cleanly")
    run_service(service)


def pick_mode(manifests: Path | None, kubeconfig: Path | None) -> KubeSettings | None:
    """None: the folder mode. Else the in-cluster settings (PROXY_OPERATOR_KUBE_*, `--kubeconfig` wins)."""
    if manifests is not None:
        return None
    kube = KubeSettings()
    if kubeconfig is not None:
        return kube.model_copy(update={"kubeconfig": kubeconfig})
    if kube.kubeconfig is None and not in_cluster():
        raise KubeClientError(
            "--manifests / --kubeconfig: give --manifests FOLDER (folder mode) or --kubeconfig FILE "
            "(in-cluster mode against that cluster); in a pod the in-cluster mode needs neither"
        )
    return kube


if __name__ == "__main__":
    app()
