"""`/v1/deletions`: the change the deletion budget stopped, and letting it through once, over HTTP.

The control loop behind it is real; its engine is the recording stand-in (tests/automation/standin_engine.py),
since what is checked here is the route and the budget, not Pulumi.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx

from service.api import create_app
from service.auth import TokenAuthenticator, hash_token
from service.discovery.memory import MemoryStore
from service.discovery.service import DiscoveryService
from service.runner import _settle
from service.settings import DiscoverySettings
from tests.automation.standin_engine import RecordingEngine
from tests.service.conftest import TOKENS, auth
from tests.service.test_declared_deletion import NAMES, Folder, apply, running_fleet


def test_a_stopped_change_is_shown_and_allowed_once(tmp_path: Path) -> None:
    folder = Folder(tmp_path / "m")
    engine = RecordingEngine(installation="ours")
    tokens = tmp_path / "tokens.json"
    entries = [{"name": n, "scopes": s, "sha256": hash_token(t)} for n, (t, s) in TOKENS.items()]
    tokens.write_text(json.dumps(entries))

    async def scenario() -> None:
        controller = await running_fleet(folder, engine, tmp_path / "s")
        app = create_app(
            inventory=controller.inventory,
            discovery=DiscoveryService(
                inventory=controller.inventory, store=MemoryStore(), settings=DiscoverySettings()
            ),
            authenticator=TokenAuthenticator(path=tokens),
            deletions=controller,
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            nothing = await client.get("/v1/deletions", headers=auth("admin"))
            assert nothing.status_code == 200
            assert nothing.json() == {"held": None}

            for name in NAMES[:6]:
                folder.remove(f"proxy-{name}.yaml")
            await apply(controller)
            assert engine.backend.destroyed == []

            forbidden = await client.get("/v1/deletions", headers=auth("crawler-a"))
            assert forbidden.status_code == 403
            held = (await client.get("/v1/deletions", headers=auth("admin"))).json()["held"]
            assert held["proxies"] == [f"crawl/{n}" for n in NAMES[:6]]
            assert held["fleet"] == 8
            assert held["changeId"] in held["message"]

            wrong = await client.post("/v1/deletions/000000000000/allow", headers=auth("admin"))
            assert wrong.status_code == 404
            assert wrong.json()["error"] == "no_such_change"
            await _settle(controller)
            assert engine.backend.destroyed == [], "a wrong id allows nothing"

            allowed = await client.post(f"/v1/deletions/{held['changeId']}/allow", headers=auth("admin"))
            assert allowed.status_code == 200
            assert allowed.json() == {"changeId": held["changeId"], "allowed": True}
            await _settle(controller)
            assert sorted(engine.backend.destroyed) == held["proxies"]
            assert (await client.get("/v1/deletions", headers=auth("admin"))).json() == {"held": None}
        await controller.close(grace=1)

    asyncio.run(scenario())
