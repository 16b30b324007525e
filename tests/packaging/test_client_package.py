"""The client package as a crawler team gets it: `clients/python` built into a wheel, installed into a fresh
virtual environment that holds nothing but the wheel and httpx (with what httpx needs), and used from an
unrelated folder, sync and async, against a live discovery API, a real proxy and a real site.

The environment is made without a download: httpx and its dependencies (and nothing else: no Scrapy, no
service package, no FastAPI) are linked from the checkout's environment into one folder that a `.pth` line
puts on the new environment's path. So the test proves the wheel needs only what it declares (`pip check`)
and imports nothing of the service; the `scrapy` module says which extra it needs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from service.api import create_app
from service.auth import TokenAuthenticator, TokenEntry, hash_token
from service.discovery.memory import MemoryStore
from service.discovery.service import DiscoveryService
from service.settings import DiscoverySettings
from tests.conftest import ROOT
from tests.service.conftest import Pproxy, UvicornThread, healthy_inventory
from tests.service.site import Site

TOKEN = "packaging-token"
USE = """
import asyncio, importlib.util, json, sys
import proxy_operator_client as client

api, url = sys.argv[1], sys.argv[2]
found = {"version": client.__version__, "api": client.API_VERSION, "file": client.__file__}
others = ("service", "stacks", "scrapy", "fastapi")
found["importable"] = sorted(name for name in others if importlib.util.find_spec(name))
with client.DiscoveryClient(api, "TOKEN") as sync:
    found["sync"] = sync.fetch(url, target="127.0.0.1", wait=0).text

async def fetch():
    async with client.AsyncDiscoveryClient(api, "TOKEN") as aio:
        return (await aio.fetch(url, target="127.0.0.1", wait=0)).text

found["async"] = asyncio.run(fetch())
try:
    import proxy_operator_client.scrapy
except ImportError as exc:
    found["scrapy"] = str(exc)
print(json.dumps(found))
""".replace("TOKEN", TOKEN)


def _build_wheel(root: Path) -> Path:
    source = root / "source"
    ignore = shutil.ignore_patterns("*.egg-info", "build", "__pycache__")
    shutil.copytree(ROOT / "clients" / "python", source, ignore=ignore)
    dist = root / "dist"
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)]
    subprocess.run(pip, check=True, capture_output=True, timeout=300)
    (wheel,) = dist.glob("proxy_operator_client-*.whl")
    return wheel


def _closure(name: str) -> dict[str, metadata.Distribution]:
    """`name`'s distribution and every one it requires (without extras), by normalised name."""
    found: dict[str, metadata.Distribution] = {}
    todo = [name]
    while todo:
        wanted = todo.pop().replace("_", "-").lower()
        if wanted in found:
            continue
        dist = found[wanted] = metadata.distribution(wanted)
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return found


def _link_dependencies(folder: Path, dists: dict[str, metadata.Distribution]) -> None:
    """Link each distribution's top-level files and its metadata folder into `folder`."""
    folder.mkdir()
    for dist in dists.values():
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (folder / top).exists() and top != "__pycache__":
                (folder / top).symlink_to(source)


def _install(root: Path, wheel: Path) -> Path:
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    deps = root / "deps"
    _link_dependencies(deps, _closure("httpx"))
    (purelib / "httpx_only.pth").write_text(f"{deps}\n")
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q"]
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300)
    return venv


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("client-package")
    return _install(root, _build_wheel(root))


@pytest.fixture
def live_api() -> Iterator[tuple[str, str]]:
    """A discovery API with one healthy proxy, and a page to fetch through it: (API url, page url)."""
    proxy = Pproxy().start()
    inventory = healthy_inventory(["p0"], port=proxy.port, username="user", password="pass")
    discovery = DiscoveryService(
        inventory=inventory, store=MemoryStore(), settings=DiscoverySettings(cooldown_seconds=0)
    )
    entry = TokenEntry(name="crawler", scopes=frozenset({"lease", "report"}), sha256=hash_token(TOKEN))
    app = create_app(inventory=inventory, discovery=discovery, authenticator=TokenAuthenticator([entry]))
    server = UvicornThread(app).start()
    try:
        with Site() as site:
            yield server.url, site.url("/ok")
    finally:
        server.stop()
        proxy.stop()


def test_the_wheel_installed_alone_works_from_an_unrelated_folder(
    venv: Path, live_api: tuple[str, str], tmp_path: Path
) -> None:
    python = str(venv / "bin" / "python")
    check = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "use.py").write_text(USE)
    env = {"PATH": f"{venv / 'bin'}{os.pathsep}/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    done = subprocess.run(
        [python, "use.py", *live_api], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found: dict[str, Any] = json.loads(done.stdout)

    assert (found["version"], found["api"]) == ("1.0.0", "v1")
    assert Path(found["file"]).is_relative_to(venv), f"{found['file']} is not from the installed wheel"
    assert found["importable"] == []  # nothing of the service, and no Scrapy without the extra
    assert found["sync"] == found["async"] == "<html>ok</html>"
    assert "pip install 'proxy-operator-client[scrapy]'" in found["scrapy"]
