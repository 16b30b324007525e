"""How the CLI's failures are classified: permanent (no retry until the input changes) or transient."""

from __future__ import annotations

import pytest
from pulumi import automation as auto
from pulumi.automation._cmd import CommandResult

from automation.engine.errors import translate
from automation.errors import CredentialsError, PermanentError, TransientError


def failed(stderr: str) -> auto.errors.CommandError:
    return auto.errors.CommandError(CommandResult(stdout="", stderr=stderr, code=255))


@pytest.mark.parametrize(
    "stderr",
    [
        'error: deployments.apps "px-crawl-a" is forbidden: User "system:serviceaccount:x:y" cannot '
        'create resource "deployments" in API group "apps" in the namespace "proxies"',
        "error: 403 Forbidden: the caller does not have permission",
        "error: 401 Unauthorized",
    ],
)
def test_a_refused_permission_is_a_permanent_credentials_error(stderr: str) -> None:
    error = translate(failed(stderr), stack="in-cluster")
    assert isinstance(error, CredentialsError)
    assert isinstance(error, PermanentError)
    assert error.reason == "CredentialsRejected"


def test_a_network_failure_is_transient() -> None:
    error = translate(failed("error: dial tcp 10.0.0.1:443: connect: connection refused"), stack="s")
    assert isinstance(error, TransientError)
    assert error.reason == "NetworkError"
