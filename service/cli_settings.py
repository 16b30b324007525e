"""A command's settings: the environment's, with the options given on the command line on top.

An option left out is None and overrides nothing, so `PROXY_OPERATOR_STATE_DIR` holds unless `--state-dir`
is given. A bad value, from an option or from the environment, and a missing Pulumi CLI end the command with
one line each, naming the option or the variable and what it accepts (exit 2), never a traceback.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any

import typer
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from automation.engine.config import PulumiNotFoundError
from service.config import FolderOverlap, OperatorSettings
from service.kube.client import KubeClientError
from service.kube.settings import KubeSettings
from service.serve import ListenError
from service.settings import DiscoverySettings, HealthSettings

# Settings fields that a CLI option sets, by the option's name.
OPTIONS = {"state_dir": "--state-dir", "listen_host": "--host", "listen_port": "--port"}
_ENV_PREFIX = {
    model.__name__: str(model.model_config.get("env_prefix", ""))
    for model in (OperatorSettings, DiscoverySettings, HealthSettings, KubeSettings)
}
USAGE_ERROR = 2


def command_settings(**given: Any) -> OperatorSettings:
    """OperatorSettings from the environment, overridden by the options given (None: not given)."""
    overrides = {field: value for field, value in given.items() if value is not None}
    with setup_errors(given=overrides):
        return OperatorSettings(**overrides)


@contextmanager
def setup_errors(*, given: Collection[str] = ()) -> Iterator[None]:
    """Turn a settings or set-up error into one line per problem on stderr and exit 2."""
    try:
        yield
    except ValidationError as exc:
        for line in error_lines(exc, given=given):
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(USAGE_ERROR) from None
    except PulumiNotFoundError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(USAGE_ERROR) from None
    except ListenError as exc:
        typer.echo(f"error: --host/--port: {exc}", err=True)
        raise typer.Exit(USAGE_ERROR) from None
    except (KubeClientError, FolderOverlap) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(USAGE_ERROR) from None


def error_lines(exc: ValidationError, *, given: Collection[str] = ()) -> list[str]:
    """`option: what it accepts (got value)` for each error; the variable's name when no option set it."""
    prefix = _ENV_PREFIX.get(exc.title, "PROXY_OPERATOR_")
    from_options = exc.title == OperatorSettings.__name__
    return [
        f"{_source(error, prefix=prefix, given=given if from_options else ())}: {_what(error)}"
        for error in exc.errors()
    ]


def _source(error: ErrorDetails, *, prefix: str, given: Collection[str]) -> str:
    path = [str(part) for part in error["loc"]]
    if not path:
        return f"{prefix}*"  # a rule across fields: its message names them
    if path[0] in given:
        return OPTIONS.get(path[0], f"--{path[0].replace('_', '-')}")
    return prefix + "_".join(path).upper()


def _what(error: ErrorDetails) -> str:
    message = error["msg"].removeprefix("Value error, ")
    if error["loc"] and not isinstance(error.get("input"), dict):
        message += f" (got {error['input']!r})"
    return message
