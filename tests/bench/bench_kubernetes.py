"""Benchmark: one `up` of a kubernetes stack with 20 Proxies against a real API server vs. the same program
under Pulumi mocks.

Prints figures and the ratio; asserts nothing about time. The real side is the service's `Engine` (Pulumi CLI,
language host, the pulumi-resource-kubernetes plugin from .tools/bin) creating each proxy's Secret,
Deployment, Service and NetworkPolicy on the tests' etcd + kube-apiserver (tests/kube/apiserver.py; built by
`make kube-tools`), with the test-only PROXY_OPERATOR_K8S_BARE_APISERVER=1 (no kubelet there: no await, and
background deletion). Then an `up` with nothing to change and the `destroy`, for scale. The mocked side runs
the same program in this process with `pulumi.runtime.set_mocks` (tests/stacks/program_harness.py), as the
unit tests do: it shows what the mocks leave out (the CLI, the plugins, the API server's round trips).
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
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kubernetes import client as kube_client  # noqa: E402

from automation.engine import Engine, EngineConfig, StackInput  # noqa: E402
from stacks.models import KubernetesProvider  # noqa: E402
from stacks.programs.context import ProgramSettings  # noqa: E402
from stacks.programs.kubernetes import BARE_APISERVER_ENV  # noqa: E402
from tests.kube.apiserver import running_apiserver  # noqa: E402
from tests.stacks.program_harness import RecordingMocks, install, proxy, run  # noqa: E402

PROXIES, NAMESPACE, STACK = 20, "bench", "bench"
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


def bench_real(tmp: Path) -> tuple[float, float, float, dict[str, int]]:
    os.environ["PATH"] = f"{ROOT / '.tools' / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    os.environ["PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION"] = "true"
    os.environ[BARE_APISERVER_ENV] = "1"
    (tmp / "kube").mkdir()
    with running_apiserver(tmp / "kube") as api:
        os.environ["KUBECONFIG"] = str(api.kubeconfig)
        with api.client() as client:
            kube_client.CoreV1Api(client).create_namespace({"metadata": {"name": NAMESPACE}})
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
        unchanged, _ = _timed(lambda: engine.up(spec))
        destroyed, _ = _timed(lambda: engine.destroy(STACK))
        with api.client() as client:
            left = kube_client.AppsV1Api(client).list_namespaced_deployment(NAMESPACE).items
        assert not left, "destroy left Deployments behind"
    return created, unchanged, destroyed, dict(result.changes)


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
        created, unchanged, destroyed, changes = bench_real(Path(tmp))
    mocked, registered = bench_mocks()
    print(
        f"kubernetes stack, {PROXIES} proxies, real API server: up {created:.2f} s ({changes}), "
        f"up with nothing to change {unchanged:.2f} s, destroy {destroyed:.2f} s"
    )
    print(
        f"same program under mocks: {mocked * 1000:.0f} ms (median of 3; {registered} resources registered)"
    )
    print(f"ratio real up / mocks: {created / mocked:.0f}x")


if __name__ == "__main__":
    main()
