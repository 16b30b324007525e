"""A stack plan turned into the program's input: JSON stack config, credentials, and the final hash."""

from __future__ import annotations

import json
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
    skipped: dict[str, str] = field(default_factory=dict)  # key -> why it was left out


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
    proxies = []
    for item in applied if isinstance(applied, list) else []:
        try:
            metadata = {
                "name": item["name"],
                "namespace": item["namespace"],
                "labels": item.get("labels") or {},
            }
            proxies.append(Proxy.model_validate({"metadata": metadata, "spec": item["spec"]}))
        except (KeyError, TypeError, ValueError):
            continue  # an older or foreign output: no last-good version, nothing lost
    return proxies


def resolve_stack(plan: StackPlan, credentials: CredentialSource) -> ResolvedStack:
    """Resolve Secret-backed credentials; a proxy whose Secret cannot be read is left out and reported.

    The final hash covers the plan's hash and the resolved credentials, so rotating a Secret re-runs `up`.
    """
    assert plan.entry is not None, "plan a stack without a catalogue entry? the reconciler checks first"
    secrets: dict[str, dict[str, str]] = {}
    skipped: dict[str, str] = {}
    included = []
    for planned in plan.proxies:
        proxy = planned.proxy
        if proxy.spec.auth.mode == "secret":
            found = credentials.credentials_for(proxy)
            if not found:
                ref = proxy.spec.auth.secret_ref
                where = f"{ref.namespace or proxy.metadata.namespace}/{ref.name}" if ref else "?"
                skipped[proxy.key] = (
                    f"Secret {where} with keys `username` and `password` was not found: create it, "
                    f"or use auth.mode: generated"
                )
                continue
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
    )
    return ResolvedStack(input=stack_input, skipped=skipped)
