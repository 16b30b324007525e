"""Run in a fresh interpreter: what a follower's process has imported (issue 20, the lazy imports).

`python -m tests.service.follower_modules CONFIG NAMESPACE STATE_DIR [SECONDS]` imports the CLI
(`serve`'s entry point), builds the in-cluster service as `serve` does and, with SECONDS, runs it that
long: a follower when another replica holds the Lease. CONFIG is a kubeconfig file (`serve --kubeconfig`),
or a folder holding a ServiceAccount's token, ca.crt and namespace (a pod's configuration: the caller sets
KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT; `KubeApi.service_account`). It prints one JSON line:
which of `HEAVY` (and, configured as in a pod, of `HEAVY_IN_POD`) it imported, how many terms it led, and
the keys its inventory served. Without SECONDS nothing contacts the API server (the configuration may name
an address where nothing listens).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

# What a follower never needs: the Automation API and the SDK under it (gRPC, protobuf, dill), the stacks'
# programs, the Compute API's HTTP client. In a cluster no replica imports them: its CLI calls run in an
# engine host (automation/engine/hosted.py). (OpenTelemetry is not here: FastAPI imports it.) Nor, on the
# memory store (the default), does any replica need the Redis client (redis-py: about 7 MiB of RSS), nor a
# WebSocket implementation (service/api_server.py, WS).
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
# What a replica in a pod (no kubeconfig) never needs either: the `kubernetes` package's other features and
# its kubeconfig loader, with requests, oauthlib and google-auth (about 6.5 MiB: service/lean_packages.py).
HEAVY_IN_POD = (
    "kubernetes.config.kube_config",
    "kubernetes.dynamic",
    "kubernetes.stream",
    "kubernetes.informer",
    "kubernetes.leaderelection",
    "websocket",
    "requests",
    "requests_oauthlib",
    "oauthlib",
    "google.auth",
)


def loaded(in_pod: bool = False) -> list[str]:
    names = HEAVY + HEAVY_IN_POD if in_pod else HEAVY
    return [name for name in names if name in sys.modules]


async def follow(service: object, seconds: float) -> None:
    from service.serve import Service, serve

    assert isinstance(service, Service)
    task = asyncio.create_task(serve(service))
    await asyncio.sleep(seconds)
    service.server.should_exit = True
    await asyncio.wait_for(task, timeout=30)


def main(config: Path, namespace: str, state_dir: Path, seconds: float | None) -> None:
    import service.cli  # the entry point `proxy-operator serve` imports first
    from service.config import OperatorSettings
    from service.incluster import ClusterMode
    from service.kube.settings import KubeSettings
    from service.serve import build_service

    settings = OperatorSettings(state_dir=state_dir, listen_port=0)
    in_pod = config.is_dir()
    where = {"service_account_dir": config} if in_pod else {"kubeconfig": config}
    kube = KubeSettings(
        **where,
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
    built = loaded(in_pod)
    if seconds is not None:
        asyncio.run(follow(service, seconds))
    else:
        service.listener.close()
    print(
        json.dumps(
            {
                "built": built,
                "loaded": loaded(in_pod),
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
