"""How the CLI's failures are classified: permanent (no retry until the input changes) or transient."""

from __future__ import annotations

import pytest
from pulumi import automation as auto
from pulumi.automation._cmd import CommandResult

from automation.engine.errors import translate
from automation.errors import CredentialsError, PermanentError, StackLockedError, TransientError


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


def test_a_held_lock_names_its_holders_as_the_cli_reports_them() -> None:
    stderr = (
        "error: the stack is currently locked by 1 lock(s).\n"
        "  file:///state/.pulumi/locks/organization/proxy-operator/local/1.json: created by "
        "root@replica-b (pid 42) at 2026-11-30T10:00:00Z"
    )
    error = translate(
        auto.errors.ConcurrentUpdateError(CommandResult(stdout="", stderr=stderr, code=255)), stack="s"
    )
    assert isinstance(error, StackLockedError)
    assert error.reason == "StackLocked"
    assert error.holders == ("root@replica-b (pid 42)",)


def test_a_programs_invalid_input_line_leads_the_message() -> None:
    """As the kvm program failed on a refused host key (the test KVM host): progress and traceback lines
    first in the CLI's output, the program's own `InvalidInput: ...` (what to fix) last."""
    stderr = "\n".join(
        [
            "+  pulumi-python:dynamic/proxy-operator:LibvirtBaseVolume base creating (0s) error: Traceback "
            "(most recent call last):",
            "+  pulumi-python:dynamic/proxy-operator:LibvirtBaseVolume base **creating failed** error: "
            "Traceback (most recent call last):",
            "error: update failed",
            "stacks.programs.libvirt_conn.HostKeyRejectedError: InvalidInput: the SSH host key of KVM host "
            "[10.0.0.2]:2222 was refused: record the host's key in the known_hosts of the kvm SSH Secret",
        ]
    )
    error = translate(failed(stderr), stack="kvm-home")
    assert isinstance(error, PermanentError)
    assert error.message.startswith(
        "stack kvm-home: stacks.programs.libvirt_conn.HostKeyRejectedError: InvalidInput: the SSH host key"
    ), error.message
    assert "update failed" in error.message  # the rest is kept, after it


def test_the_whole_reason_leads_even_past_the_cut_when_the_progress_line_shortened_it() -> None:
    """The progress display gives the program's line shortened; the diagnostics give it whole, maybe past
    the message's 2,000 characters (tracebacks of several resources first): the whole one leads."""
    reason = (
        "stacks.programs.libvirt_conn.HostKeyRejectedError: InvalidInput: the SSH host key of KVM host "
        "[10.0.0.2]:2222 was refused: put the host's key in the known_hosts (ssh-keyscan -p 2222 10.0.0.2)"
    )
    noise = [f"error: Traceback (most recent call last): frame {i} " + "x" * 80 for i in range(30)]
    shortened = "+  LibvirtBaseVolume base **creating failed** error: " + reason[:120]
    stderr = "\n".join([shortened, *noise, reason])
    error = translate(failed(stderr), stack="kvm-home")
    assert isinstance(error, PermanentError)
    assert error.message.startswith(f"stack kvm-home: {reason}"), error.message[:300]
    assert len(error.message) <= 2000 + len("stack kvm-home: ")
