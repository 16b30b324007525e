"""The `proxy-operator` command line: each command parses options and calls a function the tests call."""

from __future__ import annotations

from pathlib import Path

import typer

from service.validate import validate_manifests

app = typer.Typer(no_args_is_help=True, help="Run and inspect a fleet of forward proxies for crawlers.")


@app.callback()
def main() -> None:
    """proxy-operator: Proxy objects in, one Pulumi stack per provider, a discovery API out."""


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


if __name__ == "__main__":
    app()
