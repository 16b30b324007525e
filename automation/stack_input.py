"""A stack plan turned into the program's input: JSON stack config, credentials, and the final hash."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from automation.engine import StackInput
from automation.errors import CredentialsError
from automation.planner import StackPlan
from stacks.models import ProviderEntry, Proxy
from stacks.spec_hash import sha256_hex


class CredentialSource(Protocol):
    """Where Secrets are read: proxy credentials (auth.mode secret) and the provider's own credentials."""

    def credentials_for(self, proxy: Proxy) -> dict[str, str] | None: ...

    def secret_value(self, name: str, key: str) -> str | None: ...


# Catalogue fields naming a Secret, and the key of it that the program receives as providerCredentials.
PROVIDER_SECRETS = (("credentials_secret", "credentials.json"), ("kubeconfig_secret", "kubeconfig"))


def provider_credentials(entry: ProviderEntry, credentials: CredentialSource) -> str | None:
    """The entry's credentials Secret value, None when the entry names none (ambient credentials)."""
    for field_name, key in PROVIDER_SECRETS:
        secret = getattr(entry, field_name, None)
        if secret:
            value = credentials.secret_value(secret, key)
            if value is None:
                raise CredentialsError(
                    f"provider '{entry.name}': Secret '{secret}' with key `{key}` was not found: create it, "
                    f"or remove {field_name} from the catalogue entry to use ambient credentials",
                    reason="CredentialsMissing",
                )
            return value
    return None


@dataclass(frozen=True)
class ResolvedStack:
    input: StackInput
    skipped: dict[str, str] = field(default_factory=dict)  # key -> why it was left out (never applied)
    held: dict[str, str] = field(default_factory=dict)  # key -> why it keeps its applied credentials


def program_proxy(proxy: Proxy) -> dict[str, object]:
    """One entry of `proxy-operator:proxies`, per the program's contract."""
    return {
        "namespace": proxy.metadata.namespace,
        "name": proxy.metadata.name,
        "labels": dict(proxy.metadata.labels),
        "spec": proxy.spec.model_dump(by_alias=True, mode="json", exclude_none=True),
    }


def applied_proxies(applied: object) -> list[Proxy]:
    """The inverse of `program_proxy`, for the `appliedProxies` output read back after a restart."""
    return [proxy for proxy, _error in _read_applied(applied) if proxy is not None]


def unreadable_applied(applied: object) -> list[str]:
    """`ns/name: why` for applied entries the current model refuses (a rule got stricter since)."""
    return [error for proxy, error in _read_applied(applied) if proxy is None and error]


def _read_applied(applied: object) -> list[tuple[Proxy | None, str]]:
    read: list[tuple[Proxy | None, str]] = []
    for item in applied if isinstance(applied, list) else []:
        try:
            metadata = {
                "name": item["name"],
                "namespace": item["namespace"],
                "labels": item.get("labels") or {},
            }
        except (KeyError, TypeError, AttributeError):
            read.append((None, ""))  # not ours: nothing to hold, nothing to lose
            continue
        try:
            read.append((Proxy.model_validate({"metadata": metadata, "spec": item["spec"]}), ""))
        except (KeyError, TypeError, ValueError) as exc:
            read.append((None, f"{metadata['namespace']}/{metadata['name']}: {exc}".replace("\n", " ")))
    return read


def resolve_stack(
    plan: StackPlan,
    credentials: CredentialSource,
    *,
    applied_credentials: Mapping[str, Mapping[str, str]] | None = None,
) -> ResolvedStack:
    """Resolve Secret-backed credentials. A proxy whose Secret cannot be read keeps the credentials it was
    applied with (`applied_credentials`, the stack's secret output) and is reported as held; one that was
    never applied is left out and reported.

    The final hash covers the plan's hash and the resolved credentials, so rotating a Secret re-runs `up`
    and holding the applied credentials does not.
    """
    assert plan.entry is not None, "plan a stack without a catalogue entry? the reconciler checks first"
    applied_credentials = applied_credentials or {}
    secrets: dict[str, dict[str, str]] = {}
    skipped: dict[str, str] = {}
    held: dict[str, str] = {}
    included = []
    for planned in plan.proxies:
        proxy = planned.proxy
        if proxy.spec.auth.mode == "secret":
            found = credentials.credentials_for(proxy)
            if not found:
                missing = _missing_secret(proxy)
                kept = applied_credentials.get(proxy.key)
                if not kept:
                    skipped[proxy.key] = missing
                    continue
                held[proxy.key] = f"{missing}; it keeps the credentials it was applied with"
                found = {"username": str(kept.get("username", "")), "password": str(kept.get("password", ""))}
            secrets[proxy.key] = found
        included.append(proxy)
    proxies_json = json.dumps([program_proxy(p) for p in included], sort_keys=True, separators=(",", ":"))
    credentials_json = json.dumps(secrets, sort_keys=True, separators=(",", ":"))
    provider_secret = provider_credentials(plan.entry, credentials)
    included_keys = {p.key for p in included}
    final_hash = sha256_hex(
        {
            "plan": plan.spec_hash,
            "left_out": sorted(k for k in (p.key for p in plan.proxies) if k not in included_keys),
            "credentials": sha256_hex(secrets),
            "provider_credentials": sha256_hex(provider_secret or ""),
        }
    )
    stack_input = StackInput(
        name=plan.name,
        provider_json=plan.entry.model_dump_json(by_alias=True),
        proxies_json=proxies_json,
        credentials_json=credentials_json,
        spec_hash=final_hash,
        provider_credentials=provider_secret,
        skip_checkpoints=getattr(plan.entry, "checkpoints", "eachStep") == "end",
    )
    return ResolvedStack(input=stack_input, skipped=skipped, held=held)


def _missing_secret(proxy: Proxy) -> str:
    ref = proxy.spec.auth.secret_ref
    where = f"{ref.namespace or proxy.metadata.namespace}/{ref.name}" if ref else "?"
    return (
        f"Secret {where} with keys `username` and `password` was not found or does not decode: create or "
        f"fix it, or use auth.mode: generated"
    )
