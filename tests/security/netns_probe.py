"""Run inside a fresh network namespace (`unshare --net`): test-owned hosts on the metadata and a private
address, the VM's nftables rules, and the local forward proxy. Prints one JSON object of outcomes.

Nothing leaves the namespace: its only interface is its own loopback, which holds 169.254.169.254 and
10.20.30.40 for the length of the run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from stacks.models import EgressSpec
from stacks.programs.vm_egress import DNS_MARK, nft_rules

METADATA, PRIVATE = "169.254.169.254", "10.20.30.40"


class _Site(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"token: secret\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _site(host: str) -> None:
    server = ThreadingHTTPServer((host, 80), _Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def _connects_as(user: str, host: str) -> bool:
    code = f"import socket; socket.create_connection(({host!r}, 80), timeout=3).close()"
    group = "nogroup" if user == "nobody" else user
    command = ["setpriv", "--reuid", user, "--regid", group, "--clear-groups", sys.executable, "-c", code]
    return subprocess.run(command, capture_output=True, check=False).returncode == 0


def _nft(policy: EgressSpec) -> None:
    rules = nft_rules(policy, user="nobody").replace(DNS_MARK, "")
    subprocess.run(["nft", "-f", "-"], input=rules.encode(), check=True)


def _via_proxy(policy: EgressSpec, host: str) -> tuple[int, str]:
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder, "proxy.json")
        config.write_text(
            json.dumps(
                {
                    "bind": "127.0.0.1",
                    "port": 3128,
                    "protocol": "http",
                    "egress": policy.model_dump(by_alias=True),
                }
            )
        )
        proxy = subprocess.Popen(
            [sys.executable, "-m", "stacks.forward_proxy", str(config)], stdout=subprocess.DEVNULL
        )
        try:
            for _ in range(200):
                try:
                    socket.create_connection(("127.0.0.1", 3128), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            with httpx.Client(proxy="http://127.0.0.1:3128", timeout=5) as client:
                response = client.get(f"http://{host}/")
            return response.status_code, response.headers.get("Proxy-Status", "")
        finally:
            proxy.terminate()
            proxy.wait()


def main() -> None:
    for command in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", f"{METADATA}/32", "dev", "lo"]):
        subprocess.run(command, check=True)
    subprocess.run(["ip", "addr", "add", f"{PRIVATE}/32", "dev", "lo"], check=True)
    _site(METADATA)
    _site(PRIVATE)
    wide = EgressSpec.model_validate({"allow": [{"cidr": "169.254.0.0/16"}, {"cidr": f"{PRIVATE}/32"}]})
    outcomes = {
        "proxy_metadata_default": _via_proxy(EgressSpec(), METADATA),
        "proxy_metadata_wide": _via_proxy(wide, METADATA),
        "proxy_private_default": _via_proxy(EgressSpec(), PRIVATE),
        "proxy_private_allowed": _via_proxy(wide, PRIVATE),
        "nobody_before_rules": _connects_as("nobody", METADATA),
    }
    _nft(EgressSpec())
    outcomes |= {
        "nobody_metadata": _connects_as("nobody", METADATA),
        "nobody_private": _connects_as("nobody", PRIVATE),
        "root_metadata": _connects_as("root", METADATA),
    }
    subprocess.run(["nft", "delete", "table", "inet", "proxy_operator_egress"], check=True)
    _nft(wide)
    outcomes |= {
        "nobody_private_allowed": _connects_as("nobody", PRIVATE),
        "nobody_metadata_wide": _connects_as("nobody", METADATA),
    }
    print(json.dumps(outcomes))


if __name__ == "__main__":
    os.environ.pop("HTTP_PROXY", None)
    main()
