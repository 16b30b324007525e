"""The `proxy-operator` command line: each command parses options and calls a function the tests call."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from service.cli_settings import command_settings, setup_errors
from service.cli_stacks import preview_command, stacks_app
from service.logging_setup import configure_logging
from service.runner import apply_once
from service.serve import build_service, token_hint
from service.serve import serve as serve_forever
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
    manifests: Manifests,
    state_dir: StateDir = None,
    host: str | None = typer.Option(None, "--host", help="Address the API listens on. [default: 127.0.0.1]"),
    port: int | None = typer.Option(
        None, "--port", help="Port of the API; 0: any free port. [default: 8080]"
    ),
    json_logs: bool = typer.Option(False, "--json-logs", help="One JSON object per log line."),
) -> None:
    """Reconcile the manifests and keep watching them; health-check the proxies; serve the API."""
    configure_logging(as_json=json_logs)
    settings = command_settings(state_dir=state_dir, listen_host=host, listen_port=port)
    with setup_errors():
        service = build_service(settings, manifests)
    url = f"http://{settings.listen_host}:{service.port}"
    typer.echo(f"serving on {url} (token: {token_hint(settings)}); Ctrl-C stops cleanly")
    asyncio.run(serve_forever(service))


if __name__ == "__main__":
    app()
