"""The `proxy-operator` command line: each command parses options and calls a function the tests call."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from service.cli_stacks import preview_command, stacks_app
from service.config import OperatorSettings
from service.logging_setup import configure_logging
from service.runner import apply_once
from service.validate import validate_manifests

app = typer.Typer(no_args_is_help=True, help="Run and inspect a fleet of forward proxies for crawlers.")


@app.callback()
def main() -> None:
    """proxy-operator: Proxy objects in, one Pulumi stack per provider, a discovery API out."""


app.add_typer(stacks_app, name="stacks")
app.command("preview")(preview_command)


@app.command()
def validate(
    manifests: Path = typer.Option(..., "--manifests", help="Folder of Proxy manifests and one catalogue."),
) -> None:
    """Check Proxies and the provider catalogue; exit 1 listing every problem."""
    report = validate_manifests(manifests)
    for problem in report.problems:
        typer.echo(str(problem))
    typer.echo(report.summary())
    raise typer.Exit(0 if report.ok else 1)


@app.command()
def up(
    manifests: Path = typer.Option(..., "--manifests", help="Folder of Proxy manifests and one catalogue."),
    state_dir: Path = typer.Option(Path(".state"), "--state-dir", help="Work dirs, default file backend."),
) -> None:
    """Apply the manifests once (every stack they change or empty) and exit: for a GitOps job."""
    configure_logging()
    settings = OperatorSettings(state_dir=state_dir)
    report = asyncio.run(apply_once(settings, manifests))
    for problem in report.problems:
        typer.echo(f"problem: {problem}", err=True)
    for name, error in sorted(report.errors.items()):
        typer.echo(f"error: {name}: {error}", err=True)
    for key, address in sorted(report.addresses.items()):
        typer.echo(f"{key}\t{address}")
    typer.echo(
        f"{len(report.stacks)} stack(s), {len(report.addresses)} proxy address(es), "
        f"{len(report.errors) + len(report.problems)} problem(s)"
    )
    raise typer.Exit(0 if report.ok else 1)


if __name__ == "__main__":
    app()
