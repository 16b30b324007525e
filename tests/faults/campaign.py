"""A seeded fault campaign: a real kube-apiserver + etcd, the real Pulumi engine, `local` proxies, and two or
three `proxy-operator serve --kubeconfig` replicas as OS processes, disturbed by a random sequence of faults
while Proxies come and go; the invariants (tests/faults/invariants.py) are checked all along.

    python -m tests.faults.campaign --seed 1 --sequences 3 --faults-per-sequence 4 --replicas 2

See tests/faults/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults.faults import FAULTS, Context
from tests.faults.invariants import Watcher, pending, settle, strays
from tests.faults.record import Record, install_wrapper
from tests.faults.relay import Relay
from tests.faults.replicas import ReplicaSet
from tests.faults.world import PROVIDERS, Violation, World
from tests.kube.apiserver import ROOT, restartable_apiserver
from tests.kube.manifests import install_crds

FLEET = 6  # live Proxies at the start of each sequence
NAMESPACE, SERVICE_NAMESPACE = "crawl", "proxy-operator"


@dataclass
class Summary:
    seed: int
    sequences: int
    faults: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    seconds: float = 0.0
    record: Path | None = None

    def by_kind(self) -> Counter[str]:
        return Counter(v.kind for v in self.violations)

    def text(self) -> str:
        lines = [f"seed {self.seed}: {self.sequences} sequence(s), {sum(self.faults.values())} faults in "
                 f"{self.seconds:.0f} s; record {self.record}"]  # fmt: skip
        lines += [f"  fault {kind}: {count}" for kind, count in sorted(self.faults.items())]
        lines.append(f"  violations: {len(self.violations)}")
        for kind, count in sorted(self.by_kind().items()):
            example = next(v for v in self.violations if v.kind == kind)
            lines.append(
                f"  violation {kind}: {count}  e.g. (seq {example.sequence}) {example.message[:400]}"
            )
        return "\n".join(lines)


def engine_env(root: Path, wrapper: Path, backend: Path, probe_url: str) -> dict[str, str]:
    home = root / "pulumi-home"
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PULUMI_BACKEND_URL": backend.as_uri(),
        "PULUMI_CONFIG_PASSPHRASE": "faults-passphrase",
        "PULUMI_HOME": str(home),
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "PROXY_OPERATOR_PULUMI_PATH": str(wrapper),
        "PROXY_OPERATOR_BACKEND_URL": backend.as_uri(),
        "PROXY_OPERATOR_INSTALLATION": "faults",
        "PROXY_OPERATOR_POLL_SECONDS": "0.5",
        "PROXY_OPERATOR_BACKOFF_BASE_SECONDS": "0.5",
        "PROXY_OPERATOR_BACKOFF_CAP_SECONDS": "3",
        "PROXY_OPERATOR_RESYNC_SECONDS": "0",
        "PROXY_OPERATOR_DELETION_BUDGET_COUNT": "2",  # a mass deletion of a small fleet passes the budget
        # As deploy/deployment.yaml does: the probe URL names the Service, the same for every replica. Left
        # to its default (http://127.0.0.1:<this replica's port>/v1/echo), every replica has its own, the
        # programs put it in every proxy's egress policy (a replacing input of a local proxy), and each new
        # leader's first `up` replaced every proxy of every stack (the run of 2026-12-01: 8 of 8
        # undeclared-destroy violations were these replacements).
        "PROXY_OPERATOR_HEALTH_PROBE_URL": probe_url,
        # The replicas (and the programs, providers and proxies they start) run this tree's code, not the
        # editable install's (.venv may be another checkout's).
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }


class ServiceTarget:
    """What the Service relay reaches: the leader's API port (it is the one probing), else any live replica;
    looked up at most once a second."""

    def __init__(self) -> None:
        self.fleet: ReplicaSet | None = None
        self._cached: tuple[float, int | None] = (0.0, None)

    def __call__(self) -> int | None:
        if self.fleet is None:
            return None
        at, port = self._cached
        if time.monotonic() - at < 1.0 and port is not None:
            return port
        leader = self.fleet.leader()
        live = self.fleet.live()
        chosen = leader or (live[0] if live else None)
        port = chosen.port if chosen is not None else None
        self._cached = (time.monotonic(), port)
        return port


def kill_proxies(state: Path) -> None:
    out = subprocess.run(["pgrep", "-f", str(state)], capture_output=True, text=True, check=False)
    for pid in (int(p) for p in out.stdout.split()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_settled(world: World, within: float) -> bool:
    deadline = time.time() + within
    while time.time() < deadline:
        if not pending(world):
            return True
        time.sleep(1)
    return False


def run(root: Path, *, seed: int, sequences: int, faults_per_sequence: int, replicas: int,
        kinds: list[str] | None = None, bound: float = 90.0) -> Summary:  # fmt: skip
    """The campaign in `root` (kept afterwards: logs, the record); its summary."""
    started = time.monotonic()
    kinds = kinds or list(FAULTS)
    picker = random.Random(seed)  # the faults, drawn up front: the same plan whatever the timing
    plan = [[picker.choice(kinds) for _ in range(faults_per_sequence)] for _ in range(sequences)]
    print(f"seed {seed}: plan {plan}", flush=True)
    rng = random.Random(seed + 1)  # the details (which Proxy, how long)
    calls = root / "pulumi-calls.jsonl"
    summary = Summary(seed=seed, sequences=sequences, record=calls)
    (root / "kube").mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        kube, restart = stack.enter_context(restartable_apiserver(root / "kube"))
        api = stack.enter_context(kube.client())
        install_crds(api, ROOT / "crds", cache_dir=root)
        relay = Relay(int(kube.url.rsplit(":", 1)[1]))
        stack.callback(relay.close)
        kubeconfig = relay.kubeconfig(kube.kubeconfig, root / "relay-kubeconfig")
        wrapper = install_wrapper(root / "pulumi-wrapper", calls, ROOT / ".tools" / "bin" / "pulumi",
                                  sys.executable)  # fmt: skip
        backend = root / "backend"
        backend.mkdir(exist_ok=True)
        record = Record(calls, locks=backend / ".pulumi" / "locks")  # who really held each stack's lock
        record.start()
        stack.callback(record.stop)
        world = World(api, namespace=NAMESPACE, service_namespace=SERVICE_NAMESPACE,
                      state=root / "local-proxies", backend_dir=backend)  # fmt: skip
        stack.callback(kill_proxies, world.local_state)
        for name in (NAMESPACE, SERVICE_NAMESPACE):
            world.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        world.set_catalogue(list(PROVIDERS))
        target = ServiceTarget()
        service = Relay(target)  # the operator's Service: the probe URL of every replica
        stack.callback(service.close)
        probe_url = f"http://127.0.0.1:{service.port}/v1/echo"
        fleet = ReplicaSet(api=api, root=root, kubeconfig=kubeconfig, namespace=SERVICE_NAMESPACE,
                           watched=NAMESPACE, env=engine_env(root, wrapper, backend, probe_url))  # fmt: skip
        target.fleet = fleet
        stack.callback(fleet.stop_all)
        for _ in range(replicas):
            fleet.start()
        if fleet.wait_leader(within=60) is None:
            raise RuntimeError(f"no replica leads within 60 s:\n{fleet.replicas[0].tail()}")
        watcher = Watcher(world, fleet, record)
        watcher.start()
        stack.callback(watcher.stop)
        ctx = Context(
            world=world, replicas=fleet, record=record, relay=relay, restart_apiserver=restart, rng=rng
        )
        for sequence in range(1, sequences + 1):
            world.sequence = sequence
            while len(world.live()) < FLEET:
                world.create(PROVIDERS[len(world.live()) % len(PROVIDERS)], skip_cleanup=rng.random() < 0.15)
            if not wait_settled(world, within=180):
                world.note("the fleet was not Ready within 180 s before the faults (reported at the end)")
            for kind in plan[sequence - 1]:
                churn(ctx)
                world.note(f"fault {kind} ...")
                world.note(f"fault {kind}: {FAULTS[kind](ctx)}")
                world.faults[kind] += 1
                world.last_fault = time.time()
                time.sleep(rng.uniform(1.0, 4.0))
            settle(world, fleet, bound=bound)
            strays(world, fleet)
            world.note(f"sequence {sequence} done: {len(world.violations)} violation(s) so far")
        watcher.final = True
        watcher.tick()  # the last overlaps, running calls included
        summary.faults, summary.violations = world.faults, world.violations
    summary.seconds = time.monotonic() - started
    return summary


def churn(ctx: Context) -> None:
    """Between faults: a Proxy created, or one deleted, or nothing."""
    world, rng = ctx.world, ctx.rng
    choice = rng.random()
    if choice < 0.4:
        tracked = world.create(rng.choice(PROVIDERS), skip_cleanup=rng.random() < 0.2)
        world.note(f"churn: created {tracked.name} ({tracked.provider}, skip-cleanup {tracked.skip_cleanup})")
    elif choice < 0.7:
        live = [t for t in world.live() if t.pid is not None]
        if live:
            tracked = rng.choice(live)
            world.delete(tracked)
            world.note(f"churn: deleted {tracked.name} (skip-cleanup {tracked.skip_cleanup})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, action="append", help="repeatable; default 1")
    parser.add_argument("--sequences", type=int, default=2)
    parser.add_argument("--faults-per-sequence", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=2, choices=(2, 3))
    parser.add_argument("--fault", action="append", choices=sorted(FAULTS), help="only these kinds")
    parser.add_argument("--bound", type=float, default=90.0, help="seconds after the last fault")
    parser.add_argument("--workdir", type=Path, help="default: a new temporary folder (kept)")
    args = parser.parse_args(argv)
    summaries = []
    for seed in args.seed or [1]:
        root = (
            args.workdir / f"seed-{seed}"
            if args.workdir
            else Path(tempfile.mkdtemp(prefix=f"faults-{seed}-"))
        )
        root.mkdir(parents=True, exist_ok=True)
        summary = run(root, seed=seed, sequences=args.sequences, faults_per_sequence=args.faults_per_sequence,
                      replicas=args.replicas, kinds=args.fault, bound=args.bound)  # fmt: skip
        print(summary.text(), flush=True)
        summaries.append(summary)
    print("\n== campaign summary ==")
    for summary in summaries:
        print(summary.text())
    return 1 if any(s.violations for s in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
