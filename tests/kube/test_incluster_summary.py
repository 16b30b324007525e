"""A follower's fleet page shows what only the leader knows: the leader publishes its held deletion, its
stacks' queue and its pools in a ConfigMap (service/kube/summary.py), and the follower's page reads it.

Two replicas of the real service (in-cluster mode against the test kube-apiserver, the real Pulumi engine,
`local` proxies as processes; no kubelet: the replicas run as tasks of the test). The pages are read over
HTTP after the real log in form, as a person's browser would (the browser test covers the rendering).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from kubernetes.client import ApiClient

from service.kube.client import ApiException, request_json
from tests.conftest import PulumiEnv
from tests.kube.apiserver import KubeApi
from tests.kube.cluster_fleet import ClusterFleet, dev_token, page_client, until
from tests.ports import free_port
from tests.service.ui.browser import chromium, screenshots, serious_violations, wait_for

pytestmark = pytest.mark.engine

NAMES = ["p1", "p2", "p3", "p4"]


@pytest.fixture
def fleet(kube_api: KubeApi, kube_client: ApiClient, pulumi_env: PulumiEnv, tmp_path: Path):
    fleet = ClusterFleet(
        api=kube_client, kubeconfig=kube_api.kubeconfig, root=tmp_path, backend_url=pulumi_env.backend_url
    )
    # Removing 3 of 4 is more than 25 % and more than 1: held until allowed.
    fleet.overrides = {"deletion_budget_share": 0.25, "deletion_budget_count": 1}
    yield fleet
    fleet.kill_proxies()


def summary(fleet: ClusterFleet) -> dict[str, object] | None:
    path = f"/api/v1/namespaces/{fleet.own_namespace}/configmaps/proxy-operator-summary"
    try:
        found = request_json(fleet.api, "GET", path)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(json.loads(found["data"]["summary.json"]))


def test_a_followers_page_shows_the_leaders_held_deletion_stacks_and_summary(fleet: ClusterFleet) -> None:
    """The leader holds a mass deletion; the follower's page shows its id, the exact command, the leader's
    name and the summary's age; its stacks view shows the leader's stack. Allowed on the leader, the held
    change leaves the follower's page too. Only the leader writes the summary; after a handover the new
    leader does."""
    ports = {name: free_port() for name in NAMES}

    async def scenario() -> None:
        a = await fleet.start("replica-a")
        await until(lambda: a.mode.leading, what="a leads")
        b = await fleet.start("replica-b")
        for name, port in ports.items():
            fleet.create(name, port=port)
        ready = lambda: all(  # noqa: E731
            ((fleet.get(n) or {}).get("status") or {}).get("phase") == "Ready" for n in NAMES
        )
        await until(ready, what="four proxies Ready", within=90)
        follower = await page_client(fleet, b)
        try:
            # The follower hashes the declared spec as the leader's planner does: applied = desired.
            page = (await follower.get(f"/proxy/{fleet.namespace}/p4")).text
            assert "= desired" in page, page
            page = (await follower.get("/deletions")).text
            assert "replica-a" in page, page
            assert "No deletion is held" in page, page

            for name in NAMES[:3]:
                fleet.delete(name)
            held = await until(lambda: a.mode.held_deletion, what="the leader holds the deletion", within=60)
            change = held.change_id

            async def shown() -> str | None:
                text = (await follower.get("/deletions")).text
                return text if change in text else None

            page = await until_async(shown, what="the follower's page shows the held change")
            shots = fleet.root / "screenshots"
            base = f"http://127.0.0.1:{b.service.port}"
            # Selenium blocks: in a thread, while both replicas keep serving on this loop.
            await asyncio.to_thread(in_a_browser, base, dev_token(fleet, b), change, shots)
            print(f"\nfollower page screenshots: {shots}")
            assert f"proxy-operator up --allow-deletions {change}" in page
            assert f"/v1/deletions/{change}/allow" in page
            assert re.search(r"It would remove 3 of 4 proxies", page), page
            assert "as the leader replica-a (term 1) published it" in page

            # The follower's fleet rows and /v1/status carry the leader's verdicts, from the cluster.
            async def held_on_follower() -> str | None:
                text = (await follower.get("/", params={"q": "p1"})).text
                return text if "DeletionHeld" in text else None

            row = await until_async(held_on_follower, what="the follower's fleet row says DeletionHeld")
            applied = ((fleet.get("p1") or {}).get("status") or {}).get("observedSpecHash", "")
            assert f"<code>{applied[:12]}</code>" in row, "the follower shows the applied spec hash"
            answer = await follower.get(
                "/v1/status", headers={"Authorization": f"Bearer {dev_token(fleet, b)}"}
            )
            assert answer.status_code == 200, answer.text
            reasons = {
                item["key"]: {c["reason"] for c in item["status"].get("conditions", [])}
                for item in answer.json()["items"]
            }
            assert "DeletionHeld" in reasons[f"{fleet.namespace}/p1"], reasons
            assert "DeletionHeld" not in reasons[f"{fleet.namespace}/p4"], reasons
            stacks = (await follower.get("/stacks")).text
            assert "From the leader" in stacks, stacks
            assert ">local<" in stacks, stacks
            assert 'up <span class="ok">succeeded</span>' in stacks, stacks  # the leader's last update
            assert "appliedProxies, credentials" in stacks, stacks  # the output names, sorted
            assert b.mode.summary.writes == 0, "a follower wrote the leader's summary"
            published = summary(fleet)
            assert published is not None
            assert published["leader"] == "replica-a"

            leader = f"http://127.0.0.1:{a.service.port}"
            async with httpx.AsyncClient(timeout=10) as http:  # the replicas run on this loop
                allowed = await http.post(
                    f"{leader}/v1/deletions/{change}/allow",
                    headers={"Authorization": f"Bearer {dev_token(fleet, a)}"},
                )
            assert allowed.status_code == 200, allowed.text
            await until(lambda: all(fleet.get(n) is None for n in NAMES[:3]), what="released", within=60)

            async def cleared() -> str | None:
                text = (await follower.get("/deletions")).text
                return text if "No deletion is held" in text else None

            await until_async(cleared, what="the follower's page drops the allowed change")

            # skip-cleanup: forgotten by the leader, listed on the follower's page.
            fleet.edit("p4", {"metadata": {"annotations": {"crawl.example.com/skip-cleanup": "true"}}})
            fleet.delete("p4")
            await until(lambda: fleet.get("p4") is None, what="p4 forgotten and released", within=60)

            async def forgotten() -> str | None:
                text = (await follower.get("/deletions")).text
                tail = text[text.index("What skip-cleanup forgot") :]
                return tail if f"{fleet.namespace}/p4" in tail else None

            await until_async(forgotten, what="the follower lists what skip-cleanup forgot")

            await a.stop()
            await until(lambda: b.mode.leading, what="b takes over", within=30)
            await until(
                lambda: (summary(fleet) or {}).get("leader") == "replica-b", what="b publishes the summary"
            )
        finally:
            await follower.aclose()
            await fleet.stop_all()

    asyncio.run(scenario())


def in_a_browser(base: str, token: str, change: str, shots: Path) -> None:
    """The follower's deletions view in Chromium after the log in form: the leader's held change with its
    command, no serious accessibility finding, photographed wide and narrow."""
    shots.mkdir(exist_ok=True)
    with chromium() as driver:
        driver.get(base + "/deletions")
        driver.find_element("id", "token").send_keys(token)
        driver.find_element("css selector", "form button[type=submit]").click()
        driver.get(base + "/deletions")
        main = lambda: driver.find_element("tag name", "main").text  # noqa: E731
        wait_for(lambda: change in main(), what=f"the held change {change}", driver=driver)
        assert f"proxy-operator up --allow-deletions {change}" in main()
        assert "replica-a" in main()
        assert serious_violations(driver) == []
        screenshots(driver, shots, "follower-deletions")


async def until_async(check: Callable[[], Awaitable[str | None]], *, what: str, within: float = 30.0) -> str:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        found = await check()
        if found:
            return found
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.2)
