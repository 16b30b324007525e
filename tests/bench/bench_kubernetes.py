"""Benchmark: one `up` of a kubernetes stack with 20 Proxies on a real cluster vs. the same program under
Pulumi mocks.

Prints figures and the ratio; asserts nothing about time. The real side is the service's `Engine` (Pulumi CLI,
language host, the pulumi-resource-kubernetes plugin from .tools/bin) creating each proxy's Secret,
Deployment, Service and NetworkPolicy on the test node (tests/kube/node.py; its parts from `make kube-tools`),
whose proxy pods run the service's image (`make image`, tests/kube/operator_image.py, imported into the node).
The provider awaits as it does by default, so the `up` includes the 20 rollouts (each pod Ready) and the
Services' endpoints; the `destroy` deletes in the foreground, so it includes the pods' termination. Then an
`up` with nothing to change, for scale. The node's start and the image's build and import are timed apart
and left out of the ratio. Only one test node runs on a machine at a time: this waits for another session's.
The mocked side runs the same program in this process with `pulumi.runtime.set_mocks`
(tests/stacks/program_harness.py), as the unit tests do: it shows what the mocks leave out (the CLI, the
plugins, the API server's round trips, the pods).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kubernetes import client as kube_client  # noqa: E402

from automation.engine import Engine, EngineConfig, StackInput  # noqa: E402
from stacks.models import DEFAULT_KUBERNETES_IMAGE, KubernetesProvider  # noqa: E402
from stacks.programs.context import ProgramSettings  # noqa: E402
from tests.kube.node import running_node  # noqa: E402
from tests.kube.operator_image import build_archive  # noqa: E402
from tests.kube.pods import create_namespace  # noqa: E402
from tests.stacks.program_harness import RecordingMocks, install, proxy, run  # noqa: E402

PROXIES, NAMESPACE, STACK = 20, "bench", "bench"
IMAGE = DEFAULT_KUBERNETES_IMAGE  # the proxies' default image: the service's own
T = TypeVar("T")
ENTRY = {"name": STACK, "type": "kubernetes", "namespace": NAMESPACE}


def specs() -> list[dict[str, object]]:
    return [
        {"provider": STACK, "port": 8000 + i, "allowedSourceRanges": ["10.0.0.0/8"]} for i in range(PROXIES)
    ]


def stack_input() -> StackInput:
    proxies = [
        {"namespace": "crawl", "name": f"p{i}", "labels": {}, "spec": s} for i, s in enumerate(specs())
    ]
    return StackInput(
        name=STACK, provider_json=json.dumps(ENTRY), proxies_json=json.dumps(proxies), spec_hash="bench"
    )


@dataclass
class RealFigures:
    node: float  # the node's start (KubeNode.ready_after: without waiting for another session's node)
    image: float  # the image's build (cached layers) and import
    created: float
    unchanged: float
    destroyed: float
    changes: dict[str, int]


def bench_real(tmp: Path) -> RealFigures:
    os.environ["PATH"] = f"{ROOT / '.tools' / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    os.environ["PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION"] = "true"
    (tmp / "node").mkdir()
    with running_node(tmp / "node", say=lambda line: print(f"[node] {line}", flush=True)) as node:
        booted, node_ready = time.perf_counter(), node.ready_after
        node.load_image(build_archive(say=lambda line: print(f"[image] {line}", flush=True)), name=IMAGE)
        loaded = time.perf_counter()
        os.environ["KUBECONFIG"] = str(node.kubeconfig)
        with node.client() as client:
            create_namespace(kube_client.CoreV1Api(client), NAMESPACE)
        (tmp / "backend").mkdir()
        config = EngineConfig(
            backend_url=(tmp / "backend").as_uri(),
            state_dir=tmp / "state",
            passphrase="bench",
            pulumi_home=tmp / "pulumi-home",
        )
        engine = Engine(config)
        spec = stack_input()
        created, result = _timed(lambda: engine.up(spec))
        with node.client() as client:
            ready = [d.status.ready_replicas for d in _deployments(client)]
        assert ready == [1] * PROXIES, f"the up returned before every pod was Ready: {ready}"
        unchanged, _ = _timed(lambda: engine.up(spec))
        destroyed, _ = _timed(lambda: engine.destroy(STACK))
        with node.client() as client:
            assert not _deployments(client), "destroy left Deployments behind"
            pods = kube_client.CoreV1Api(client).list_namespaced_pod(NAMESPACE).items
            assert not pods, "destroy returned before the pods were gone"
    return RealFigures(
        node=node_ready,
        image=loaded - booted,
        created=created,
        unchanged=unchanged,
        destroyed=destroyed,
        changes=dict(result.changes),
    )


def _deployments(client: kube_client.ApiClient) -> list[Any]:
    return list(kube_client.AppsV1Api(client).list_namespaced_deployment(NAMESPACE).items)


def bench_mocks(rounds: int = 3) -> tuple[float, int]:
    asyncio.set_event_loop(asyncio.new_event_loop())  # the mocks make their futures on the current loop
    entry = KubernetesProvider.model_validate(ENTRY)
    proxies = [proxy(f"p{i}", **s) for i, s in enumerate(specs())]
    settings = ProgramSettings(stack=STACK, root_dir=tempfile.gettempdir())
    samples, registered = [], 0
    for _ in range(rounds):
        mocks = RecordingMocks()
        install(mocks, stack=STACK)
        started = time.perf_counter()
        run(entry=entry, proxies=proxies, settings=settings)
        samples.append(time.perf_counter() - started)
        registered = len(mocks.resources)
    return statistics.median(samples), registered


def _timed(fn: Callable[[], T]) -> tuple[float, T]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-kubernetes-") as tmp:
        real = bench_real(Path(tmp))
    mocked, registered = bench_mocks()
    print(f"test node started in {real.node:.1f} s; image built and imported in {real.image:.1f} s")
    print(
        f"kubernetes stack, {PROXIES} proxies, test node: up {real.created:.2f} s ({real.changes}; "
        f"pods Ready), up with nothing to change {real.unchanged:.2f} s, destroy {real.destroyed:.2f} s "
        "(pods gone)"
    )
    print(
        f"same program under mocks: {mocked * 1000:.0f} ms (median of 3; {registered} resources registered)"
    )
    print(f"ratio real up / mocks: {real.created / mocked:.0f}x")


if __name__ == "__main__":
    main()
