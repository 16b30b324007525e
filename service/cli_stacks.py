"""`proxy-operator preview` and `proxy-operator stacks ...`: thin commands over functions tests call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from automation.deletion_budget import DeletionBudget
from automation.engine import Engine
from automation.errors import ProxyOperatorError
from automation.inspect import StackDetail, StackInspector, StackNotFoundError, StackSummary
from automation.preview import DesiredState, applied_in_backend, preview
from automation.preview_model import PreviewReport
from automation.preview_render import render_json, render_markdown, render_text
from service.cli_settings import command_settings, setup_errors
from service.config import OperatorSettings, check_folders
from service.pools.preview import declared, expand_for_preview
from service.sources.directory import DirectorySource
from service.validate import validate_manifests
from stacks.models import ProviderCatalogue

stacks_app = typer.Typer(no_args_is_help=True, help="Inspect the Pulumi stacks: one per provider entry.")

# None: PROXY_OPERATOR_STATE_DIR, else .state (an option given overrides the setting, a default does not).
STATE_DIR = typer.Option(None, "--state-dir", help="Work dirs, default file backend. [default: .state]")
NAME = typer.Argument(..., help="Stack name (= provider catalogue entry).")


# --- functions ------------------------------------------------------------------------------------------


def preview_manifests(
    settings: OperatorSettings, manifests: Path, *, all_stacks: bool = False
) -> PreviewReport:
    """Load a (validated) manifests folder, its ProxyPools expanded into children over what the backend
    applied, and preview the stacks it would change."""
    check_folders(settings, manifests)
    engine = Engine(settings.engine_config())
    source, read, pools = expand_for_preview(DirectorySource(manifests), applied=applied_in_backend(engine))
    desired = DesiredState(
        catalogue=source.catalogue or ProviderCatalogue(),
        proxies=declared(source),
        credentials=source,
        complete=read.complete,
        held={key: f"{hold.reason}: {hold.message}" for key, hold in read.held.items()},
    )
    report = preview(
        engine,
        desired,
        all_stacks=all_stacks,
        # Ownership is judged only when the installation is named (CI: PROXY_OPERATOR_INSTALLATION);
        # a preview changes nothing either way.
        installation=settings.installation,
        budget=DeletionBudget(
            max_share=settings.deletion_budget_share, min_count=settings.deletion_budget_count
        ),
    )
    return report.model_copy(update={"pools": pools})


def inspector(state_dir: Path | None) -> StackInspector:
    settings = command_settings(state_dir=state_dir)
    with setup_errors():
        return StackInspector(Engine(settings.engine_config()))


def summary_table(stacks: list[StackSummary]) -> str:
    header = ("NAME", "TYPE", "PROXIES", "RESOURCES", "LAST OPERATION", "RESULT", "APPLIED HASH")
    rows = [header] + [
        (
            s.name,
            s.provider_type or "?",
            str(len(s.proxies)),
            str(s.resource_count),
            s.last_operation or "-",
            s.last_result or "-",
            (s.applied_hash or "-")[:12],
        )
        for s in stacks
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def describe(detail: StackDetail, *, width: int = 160) -> str:
    """A stack for a terminal; long outputs are cut (`stacks outputs NAME` prints them whole)."""
    last = " ".join(str(v) for v in (detail.last_operation, detail.last_result, detail.last_finished) if v)
    lines = [
        f"name:           {detail.name}",
        f"provider:       {detail.provider} (type {detail.provider_type or 'unknown'})",
        f"proxies:        {len(detail.proxies)}: {', '.join(detail.proxies) or '-'}",
        f"resources:      {detail.resource_count}",
        f"last operation: {last or '-'}",
        f"applied hash:   {detail.applied_hash or '-'}",
        "outputs:",
    ]
    for key, value in sorted(detail.outputs.items()):
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        lines.append(f"  {key}: {text if len(text) <= width else text[: width - 3] + '...'}")
    return "\n".join(lines)


def _dump(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


# --- commands -------------------------------------------------------------------------------------------


def preview_command(
    manifests: Path = typer.Option(..., "--manifests", help="Folder of Proxy manifests and one catalogue."),
    all_stacks: bool = typer.Option(False, "--all", help="Preview every stack, changed or not."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable report (schemaVersion 1)."),
    markdown: bool = typer.Option(False, "--markdown", help="Summary for a pull-request comment."),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Preview what applying the manifests would create, update, replace and delete; exit 1 on a problem."""
    if as_json and markdown:
        raise typer.BadParameter("choose one of --json and --markdown")
    report = validate_manifests(manifests)
    for problem in report.problems:
        typer.echo(str(problem), err=True)  # the preview still runs: it shows what the problems hold back
    settings = command_settings(state_dir=state_dir)
    try:
        with setup_errors():
            result = preview_manifests(settings, manifests, all_stacks=all_stacks)
    except ProxyOperatorError as exc:
        raise _fail(f"{exc.reason}: {exc.message}") from exc
    render = render_json if as_json else render_markdown if markdown else render_text
    typer.echo(render(result))
    if not report.ok:
        raise _fail(report.summary())
    raise typer.Exit(0 if result.ok else 1)


@stacks_app.command("list")
def list_command(
    state_dir: Path | None = STATE_DIR,
    as_json: bool = typer.Option(False, "--json", help="JSON instead of a table."),
) -> None:
    """Each stack: provider type, proxies, resources, last operation and result, applied hash."""
    stacks = inspector(state_dir).list_stacks()
    if as_json:
        typer.echo(_dump([s.model_dump(mode="json", by_alias=True) for s in stacks]))
    elif stacks:
        typer.echo(summary_table(stacks))
    else:
        typer.echo("no stacks")


@stacks_app.command("show")
def show_command(
    name: str = NAME,
    state_dir: Path | None = STATE_DIR,
    as_json: bool = typer.Option(False, "--json", help="The full record as JSON."),
) -> None:
    """One stack: provider, proxies, resources, last operation, applied hash, outputs (secrets masked)."""
    detail = inspector(state_dir).get_stack(name)
    if detail is None:
        raise _fail(StackNotFoundError(name).message)
    typer.echo(_dump(detail.model_dump(mode="json", by_alias=True)) if as_json else describe(detail))


@stacks_app.command("outputs")
def outputs_command(
    name: str = NAME,
    show_secrets: bool = typer.Option(False, "--show-secrets", help="Print secret outputs in clear."),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """A stack's outputs (JSON); secret ones read "[secret]" unless --show-secrets."""
    try:
        found = inspector(state_dir).outputs(name, show_secrets=show_secrets)
    except StackNotFoundError as exc:
        raise _fail(exc.message) from exc
    typer.echo(_dump(found.outputs))


@stacks_app.command("export")
def export_command(
    name: str = NAME,
    show_secrets: bool = typer.Option(False, "--show-secrets", help="Decrypt secret values."),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """A stack's raw state, as `pulumi stack export` prints it (secret values stay encrypted)."""
    try:
        typer.echo(_dump(inspector(state_dir).export(name, show_secrets=show_secrets)))
    except StackNotFoundError as exc:
        raise _fail(exc.message) from exc
