"""Plan -> program input: credentials resolved from Secrets, and the final hash that covers them."""

from __future__ import annotations

import re

import pytest

from automation.errors import CredentialsError
from automation.planner import Planner
from automation.stack_input import applied_proxies, program_proxy, resolve_stack
from stacks.models import ProviderCatalogue, Proxy


class Secrets:
    """A dictionary of Secrets standing in for the source (the directory source reads `kind: Secret`)."""

    def __init__(self, values: dict[str, dict[str, str]]) -> None:
        self.values = values

    def credentials_for(self, proxy: Proxy) -> dict[str, str] | None:
        ref = proxy.spec.auth.secret_ref
        return self.values.get(ref.name) if ref else None

    def secret_value(self, name: str, key: str) -> str | None:
        return self.values.get(name, {}).get(key)


def plan_for(provider: dict, *proxies: dict):
    planner = Planner()
    planner.set_catalogue(ProviderCatalogue.model_validate({"providers": [provider]}))
    for proxy in proxies:
        planner.upsert(Proxy.model_validate(proxy))
    return planner.plan(provider["name"])


GCP = {
    "name": "gcp-eu",
    "type": "gcp",
    "project": "crawl-proj-1",
    "region": "europe-west1",
    "zone": "europe-west1-b",
    "credentialsSecret": "gcp-key",
}


def proxy(name: str, **auth: object) -> dict:
    return {
        "metadata": {"name": name, "namespace": "crawl"},
        "spec": {"provider": "gcp-eu", "allowedSourceRanges": ["10.0.0.0/8"], "auth": auth or {}},
    }


def test_provider_credentials_reach_the_input_and_the_hash() -> None:
    plan = plan_for(GCP, proxy("a"))
    first = resolve_stack(plan, Secrets({"gcp-key": {"credentials.json": '{"k": 1}'}})).input
    rotated = resolve_stack(plan, Secrets({"gcp-key": {"credentials.json": '{"k": 2}'}})).input
    assert first.provider_credentials == '{"k": 1}'
    assert first.spec_hash != rotated.spec_hash, "rotating the key must re-run up"


def test_missing_provider_secret_is_a_permanent_error_naming_it() -> None:
    plan = plan_for(GCP, proxy("a"))
    with pytest.raises(CredentialsError, match=r"Secret 'gcp-key' with key `credentials\.json`"):
        resolve_stack(plan, Secrets({}))


def test_missing_proxy_secret_leaves_only_that_proxy_out() -> None:
    plan = plan_for(GCP, proxy("a"), proxy("b", mode="secret", secretRef={"name": "b-auth"}))
    secrets = Secrets({"gcp-key": {"credentials.json": "{}"}})
    resolved = resolve_stack(plan, secrets)
    assert list(resolved.skipped) == ["crawl/b"]
    assert "b-auth" in resolved.skipped["crawl/b"]
    assert '"name":"a"' in resolved.input.proxies_json
    assert '"name":"b"' not in resolved.input.proxies_json
    secrets.values["b-auth"] = {"username": "u", "password": "p"}
    with_b = resolve_stack(plan, secrets)
    assert with_b.skipped == {}
    assert with_b.input.spec_hash != resolved.input.spec_hash
    assert '"crawl/b":{"password":"p","username":"u"}' in with_b.input.credentials_json


def test_applied_proxies_read_back_what_the_program_was_given() -> None:
    original = Proxy.model_validate(
        proxy("a", mode="generated")
        | {"metadata": {"name": "a", "namespace": "crawl", "labels": {"tier": "1"}}}
    )
    [back] = applied_proxies([program_proxy(original), {"name": "broken"}])  # a foreign entry is skipped
    assert back.key == original.key
    assert back.spec == original.spec
    assert back.metadata.labels == {"tier": "1"}
    assert applied_proxies(None) == []


@pytest.mark.parametrize(
    ("entry", "skip"),
    [
        ({"processModel": "shared", "checkpoints": "end"}, True),
        ({"processModel": "shared"}, False),
        ({}, False),
    ],
)
def test_a_local_entry_with_checkpoints_end_asks_the_engine_to_save_once(entry: dict, skip: bool) -> None:
    local = {"name": "bulk", "type": "local", **entry}
    doc = {"metadata": {"name": "a", "namespace": "crawl"}, "spec": {"provider": "bulk"}}
    assert resolve_stack(plan_for(local, doc), Secrets({})).input.skip_checkpoints is skip
    assert (
        resolve_stack(
            plan_for(GCP, proxy("a")), Secrets({"gcp-key": {"credentials.json": "{}"}})
        ).input.skip_checkpoints
        is False
    )


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"checkpoints": "end"}, "checkpoints: end needs processModel: shared"),
        (
            {"checkpoints": "end", "processModel": "perProxy"},
            "set processModel: shared, or remove checkpoints",
        ),
        (
            {"checkpoints": "never", "processModel": "shared"},
            "'never' is not a checkpoint mode: use eachStep",
        ),
    ],
)
def test_checkpoints_end_is_refused_where_an_interrupted_up_cannot_be_taken_back(
    entry: dict, says: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        ProviderCatalogue.model_validate({"providers": [{"name": "bulk", "type": "local", **entry}]})
