"""`proxy-operator orphans`: resources carrying our marks that no stack's state holds; `--delete` removes
them after a confirmation (`--yes` for scripts). The finding is `automation/orphans.py`; local processes only
for now (see its docstring for the other provider types)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from automation.engine import Engine
from automation.orphans import (
    Orphan,
    forward_proxy_processes,
    known_instance_ids,
    local_orphans,
    stop_local,
)
from service.cli_settings import command_settings, setup_errors
from service.config import OperatorSettings
from stacks.manifests import load_manifests
from stacks.models import LocalProvider


def find_orphans(settings: OperatorSettings, manifests: Path) -> list[Orphan]:
    """This installation's local entries (from the catalogue) against every stack's `proxies` output."""
    catalogue = load_manifests(manifests).catalogue
    if catalogue is None:
        raise ValueError(f"{manifests}: no provider catalogue: orphans are judged by its entries")
    state_dirs = {
        entry.name: local_state_dir(entry, settings)
        for entry in catalogue.providers
        if isinstance(entry, LocalProvider)
    }
    engine = Engine(settings.engine_config())
    outputs = [engine.plain_outputs(name) for name in engine.list_stack_names()]
    return local_orphans(forward_proxy_processes(), state_dirs=state_dirs, known=known_instance_ids(outputs))


def local_state_dir(entry: LocalProvider, settings: OperatorSettings) -> Path:
    """Where the local program keeps an entry's processes (stacks/programs/local.py `state_dir`): its
    stateDir, else `.state/local-proxies` under the stack's work directory (the program's root)."""
    if entry.state_dir:
        return Path(entry.state_dir).resolve()
    return (settings.state_dir / "work" / entry.name / ".state" / "local-proxies").resolve()


def delete_orphans(orphans: list[Orphan]) -> list[Orphan]:
    return [orphan for orphan in orphans if stop_local(orphan)]


def orphans(
    manifests: Annotated[Path, typer.Option("--manifests", help="Folder with the provider catalogue.")],
    delete: Annotated[bool, typer.Option("--delete", help="Remove them, after a confirmation.")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask (scripts).")] = False,
    state_dir: Annotated[Path | None, typer.Option("--state-dir")] = None,
) -> None:
    """List resources that carry our marks but are in no stack's state."""
    settings = command_settings(state_dir=state_dir)
    with setup_errors():
        found = find_orphans(settings, manifests)
    for orphan in found:
        typer.echo(f"{orphan.provider}\t{orphan.kind}\t{orphan.id}\t{orphan.detail}")
    typer.echo(f"{len(found)} orphan(s)")
    if not delete or not found:
        return
    if not yes and not typer.confirm(f"delete {len(found)} orphan(s)?"):
        raise typer.Exit(1)
    removed = delete_orphans(found)
    typer.echo(f"deleted {len(removed)} orphan(s)")
