"""Open proxies no longer slip past validation; a running proxy the new rules refuse is held, not deleted.

Fails on the code before issue 11: two /1 ranges (the whole internet) without credentials, a `local` proxy
without credentials on 0.0.0.0, and a gcp proxy without ranges (a firewall open to the internet) were all
accepted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from stacks.models import GcpProvider, LocalProvider, ProviderCatalogue, Proxy
from stacks.models.wire import NO_AUTH_MAX_PREFIX_ENV, source_coverage
from stacks.validation import proxy_problems
from tests.automation.standin_engine import RecordingEngine
from tests.service.test_declared_deletion import Folder, apply, held_reason, make_controller


def _proxy(**spec: object) -> Proxy:
    return Proxy.model_validate(
        {"metadata": {"name": "p", "namespace": "crawl"}, "spec": {"provider": "x", **spec}}
    )


NONE = {"mode": "none"}


@pytest.mark.parametrize(
    "ranges",
    [
        ["0.0.0.0/1", "128.0.0.0/1"],
        ["::/1", "8000::/1"],
        ["10.0.0.0/17", "10.1.0.0/17", "10.2.0.0/17"],  # each under a /16, together over it
        ["2001:db8::/47"],
        ["203.0.113.0/24", "0.0.0.0/8"],
    ],
)
def test_sources_wider_than_the_limit_need_credentials(ranges: list[str]) -> None:
    with pytest.raises(ValidationError, match="without credentials"):
        _proxy(auth=NONE, allowedSourceRanges=ranges)
    assert _proxy(allowedSourceRanges=ranges).spec.auth.mode == "generated"  # with credentials: fine


def test_coverage_counts_both_families_once_and_loopback_for_nothing() -> None:
    assert source_coverage(["10.0.0.0/24", "10.0.0.0/25", "2001:db8::/126", "127.0.0.0/8", "::1"]) == (256, 4)


def test_narrow_sources_and_loopback_need_no_credentials() -> None:
    for ranges in (["203.0.113.0/24"], ["10.1.0.0/16"], ["2001:db8::/48"], ["127.0.0.0/8"]):
        assert _proxy(auth=NONE, allowedSourceRanges=ranges).spec.auth.mode == "none"


def test_too_many_ranges_without_credentials_are_refused() -> None:
    ranges = [f"203.0.{i}.0/28" for i in range(33)]
    with pytest.raises(ValidationError, match="at most 32"):
        _proxy(auth=NONE, allowedSourceRanges=ranges)


def test_the_limit_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NO_AUTH_MAX_PREFIX_ENV, "24,64")
    with pytest.raises(ValidationError, match="/24"):
        _proxy(auth=NONE, allowedSourceRanges=["10.1.0.0/23"])


def test_a_local_proxy_without_credentials_listens_on_loopback_only() -> None:
    with pytest.raises(ValidationError, match="loopback only"):
        _proxy(auth=NONE, allowedSourceRanges=["127.0.0.1/32"], local={"bindAddress": "0.0.0.0"})
    catalogue = ProviderCatalogue(providers=[LocalProvider(name="x", type="local", bindAddress="0.0.0.0")])
    [problem] = proxy_problems(_proxy(auth=NONE, allowedSourceRanges=["10.1.2.0/24"]), catalogue)
    assert (problem.path, "loopback only" in problem.message) == ("spec.auth.mode", True)


def test_a_gcp_proxy_without_ranges_is_refused_and_its_program_opens_nothing() -> None:
    entry = GcpProvider(
        name="x", type="gcp", project="proj-123", region="europe-west1", zone="europe-west1-b"
    )
    [problem] = proxy_problems(_proxy(), ProviderCatalogue(providers=[entry]))
    assert problem.path == "spec.allowedSourceRanges"
    from stacks.programs.gcp import ranges_by_family  # the program never turns [] into 0.0.0.0/0

    assert ranges_by_family([]) == {}


def test_a_running_proxy_the_new_rules_refuse_is_kept_running_with_a_warning_naming_the_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The existing machinery (the applied proxies are re-read under the current rules) keeps the stack as it
    runs: nothing is destroyed or changed, and a Warning names the rule. It freezes the whole stack, so a
    neighbour's edits wait too until the manifest is fixed (reported to the automation layer's owners)."""
    folder = Folder(tmp_path / "m")
    engine = RecordingEngine(installation="ours")
    wide = ["0.0.0.0/1", "128.0.0.0/1"]

    async def scenario() -> None:
        monkeypatch.setenv(NO_AUTH_MAX_PREFIX_ENV, "0,0")  # the rules as they were: only /0 refused
        folder.proxy("a", port=3001, auth=NONE, allowedSourceRanges=wide)
        folder.proxy("b", port=3002)
        first = await apply(make_controller(folder, engine, tmp_path / "s"))
        assert held_reason(first, "crawl/a") is None
        await first.close(grace=1)
        monkeypatch.delenv(NO_AUTH_MAX_PREFIX_ENV)  # upgraded: the same spec is now refused
        second = await apply(make_controller(folder, engine, tmp_path / "s"))
        assert engine.backend.destroyed == []
        assert engine.backend.ups == 1, "nothing of the running stack is changed"
        warnings = [e for e in second.status.events("crawl/a") if e.warning and e.reason == "InvalidSpec"]
        assert any("without credentials" in e.message for e in warnings), "the Warning names the rule"
        await second.close(grace=1)

    asyncio.run(scenario())
