"""What a provider-type builder receives: per-proxy context (component, credentials) and program settings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi

from stacks.kvm_ssh import DEFAULT_SSH_DIR
from stacks.models import EgressRule, EgressSpec
from stacks.programs.component import Credentials, InvalidInputError, ProgramProxy, ProxyComponent
from stacks.programs.credentials import GeneratedCredentials
from stacks.programs.probe_allow import ProbePods, with_rules
from stacks.programs.proxy_config import ProxySettings, check_credentials

DEFAULT_KVM_SSH_DIR = DEFAULT_SSH_DIR


@dataclass(frozen=True)
class ProgramSettings:
    stack: str
    root_dir: str
    provider_credentials: pulumi.Output[str] | None = None  # gcp key JSON or kubeconfig, a secret
    kvm_ssh_dir: str = DEFAULT_KVM_SSH_DIR
    probe_url: str | None = None  # the health probe's URL: its endpoint is allowed through every proxy
    probe_pods: ProbePods | None = None  # the service's pods in a cluster (proxy pods' NetworkPolicy)
    installation: str | None = None  # this installation's id, marked on every resource (stacks/marks.py)


@dataclass(frozen=True)
class OutputCredentials:
    username: pulumi.Output[str]
    password: pulumi.Output[str]

    def to_output(self) -> pulumi.Output[dict[str, str]]:
        return pulumi.Output.all(self.username, self.password).apply(
            lambda values: {"username": values[0], "password": values[1]}
        )


@dataclass(frozen=True)
class ProxyContext:
    proxy: ProgramProxy
    component: ProxyComponent
    credentials: OutputCredentials | None
    egress: EgressSpec  # spec.egress plus the program's own allows (the probe's echo endpoint)


class MissingCredentialsError(InvalidInputError):
    """A proxy with auth mode `secret` has no entry in the `proxy-operator:credentials` config."""


def _from_secret_config(proxy: ProgramProxy, given: Mapping[str, Any]) -> OutputCredentials:
    item = given.get(proxy.key)
    if not item or not item.get("username") or not item.get("password"):
        raise MissingCredentialsError(
            f"{proxy.key}: auth.mode is 'secret' but proxy-operator:credentials has no username/password for "
            "it; check that the Secret named in auth.secretRef exists and holds both keys"
        )
    creds = check_credentials(
        Credentials(username=str(item["username"]), password=str(item["password"])),
        where=f"{proxy.key} auth.secretRef",
    )
    return OutputCredentials(
        username=pulumi.Output.secret(creds.username), password=pulumi.Output.secret(creds.password)
    )


def resolve_credentials(
    proxy: ProgramProxy, component: ProxyComponent, given: Mapping[str, Any]
) -> OutputCredentials | None:
    mode = proxy.spec.auth.mode
    if mode == "none":
        return None
    if mode == "secret":
        return _from_secret_config(proxy, given)
    generated = GeneratedCredentials(proxy.key, opts=pulumi.ResourceOptions(parent=component))
    return OutputCredentials(username=generated.username, password=generated.password)


def proxy_context(
    proxy: ProgramProxy, given_credentials: Mapping[str, Any], extra_allow: Sequence[EgressRule] = ()
) -> ProxyContext:
    component = ProxyComponent(proxy.key)
    return ProxyContext(
        proxy=proxy,
        component=component,
        credentials=resolve_credentials(proxy, component, given_credentials),
        egress=with_rules(proxy.spec.egress, list(extra_allow)),
    )


def proxy_settings(ctx: ProxyContext) -> pulumi.Output[ProxySettings]:
    """The proxy's daemon settings once its credentials resolve (secret when they are)."""
    spec = ctx.proxy.spec

    def settings(creds: list[str]) -> ProxySettings:
        return ProxySettings(
            port=spec.port,
            protocol=spec.protocol.value,
            allowed_source_ranges=tuple(spec.allowed_source_ranges),
            egress=ctx.egress,
            credentials=Credentials(username=creds[0], password=creds[1]) if creds else None,
        )

    if ctx.credentials is None:
        return pulumi.Output.from_input(settings([]))
    return pulumi.Output.all(ctx.credentials.username, ctx.credentials.password).apply(settings)
