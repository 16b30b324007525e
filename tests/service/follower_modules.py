"""Run in a fresh interpreter: what a follower's process has imported (issue 20, the lazy imports).

`python -m tests.service.follower_modules KUBECONFIG NAMESPACE STATE_DIR [SECONDS]` imports the CLI
(`serve`'s entry point), builds the in-cluster service as `serve --kubeconfig` does and, with SECONDS, runs
it that long: a follower when another replica holds the Lease. It prints one JSON line: which of `HEAVY` it
imported, how many terms it led, and the keys its inventory served. Without SECONDS nothing contacts the API
server (the kubeconfig may name an address where nothing listens).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

# What a follower never needs: the Automation API and the SDK under it (gRPC, protobuf, dill), the stacks'
# programs, the Compute API's HTTP client. Imported by a leader's first CLI call, not before. (OpenTelemetry
# is not here: FastAPI imports it.) Nor, on the memory store (the default), does any replica need the Redis
# client (redis-py: about 7 MiB of RSS), nor a WebSocket implementation (service/api_server.py, WS).
HEAVY = (
    "redis",
    "service.discovery.redis_store",
    "wsproto",
    "pulumi",
    "pulumi.automation",
    "pulumi.runtime",
    "grpc",
    "google.protobuf",
    "dill",
    "automation.engine.command",
    "stacks.programs",
    "httpx",
)


def loaded() -> list[str]:
    return [name for name in HEAVY if name in sys.modules]


async def follow(service: object, seconds: float) -> None:
    from service.serve import Service, serve

    assert isinstance(service, Service)
    task = asyncio.create_task(serve(service))
    await asyncio.sleep(seconds)
    service.server.should_exit = True
    await asyncio.wait_for(task, timeout=30)


def main(kubeconfig: Path, namespace: str, state_dir: Path, seconds: float | None) -> None:
    import service.cli  # the entry point `proxy-operator serve` imports first
    from service.config import OperatorSettings
    from service.incluster import ClusterMode
    from service.kube.settings import KubeSettings
    from service.serve import build_service

    settings = OperatorSettings(state_dir=state_dir, listen_port=0)
    kube = KubeSettings(
        kubeconfig=kubeconfig,
        namespaces=[namespace],
        namespace=namespace,
        identity="follower",
        lease_duration_seconds=4.0,
        renew_deadline_seconds=3.0,
        retry_period_seconds=0.5,
    )
    service = build_service(settings, None, kube=kube)
    mode = service.controller
    assert isinstance(mode, ClusterMode)
    built = loaded()
    if seconds is not None:
        asyncio.run(follow(service, seconds))
    else:
        service.listener.close()
    print(
        json.dumps(
            {
                "built": built,
                "loaded": loaded(),
                "terms": mode.terms,
                "served": sorted(endpoint.key for endpoint in mode.inventory.endpoints()),
                # wiring checked where the mode is built (test_lazy_imports.py)
                "credentials_wired": (
                    mode.credentials.on_deleted == mode.credentials_writer.forget
                    and mode.credentials.shared == mode.credentials_writer.shared
                    and mode.credentials_writer.known == mode.credentials.held
                ),
            }
        )
    )


if __name__ == "__main__":
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else None
    main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), seconds)
