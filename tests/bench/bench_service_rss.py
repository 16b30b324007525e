"""Benchmark: the service's own RSS watching no Proxy, as a leader and as a follower, and its imports alone
(issue 20: lazy imports where a follower does not need a module).

Against the tests' etcd + kube-apiserver (tests/kube/apiserver.py). For each code tree of BENCH_TREES
(`label=path,...`; default this checkout) it measures, in one run and interleaved so the trees share the
machine's state:
- imports: a fresh interpreter's VmRSS after `import service.cli` (the entry point of `proxy-operator`),
  the median of BENCH_IMPORT_RUNS (5), against the bare interpreter's;
- follower: `serve --kubeconfig` whose Lease a leader that is not running holds, watching an empty
  namespace: the median VmRSS of BENCH_SAMPLES (10) samples a second apart, after BENCH_SETTLE s (15);
- leader: the same holding its own Lease, sampled after its first pass (it reads the backend: that is its
  first CLI call, which imports the Pulumi SDK).
RSS is the service process alone (its Pulumi children are other processes). Asserts nothing; prints MiB and
each tree's ratio against the first tree's. Example, main's code against this branch's:
`BENCH_TREES=before=/path/to/main,after=$PWD PYTHONPATH=$PWD .venv/bin/python
tests/bench/bench_service_rss.py` (each tree needs its .venv and .tools, or links to them).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from service.kube.client import request_json  # noqa: E402
from service.kube.lease import LeaseRecord, write_lease  # noqa: E402
from tests.kube.apiserver import KubeApi, die_with_parent, running_apiserver  # noqa: E402
from tests.kube.manifests import install_crds  # noqa: E402

TREES = [
    (label, Path(path))
    for label, _, path in (
        item.partition("=") for item in os.environ.get("BENCH_TREES", f"this={ROOT}").split(",")
    )
]
IMPORT_RUNS = int(os.environ.get("BENCH_IMPORT_RUNS", "5"))
SAMPLES = int(os.environ.get("BENCH_SAMPLES", "10"))
SETTLE = float(os.environ.get("BENCH_SETTLE", "15"))
VENV_BIN = Path(sys.executable).parent
RSS_SCRIPT = (
    "import sys\n"
    "def rss():\n"
    "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS')) / 1024\n"
    "bare = rss()\n"
    "import service.cli\n"
    "print(bare, rss())\n"
)
SERVE = "import sys; sys.argv[0] = 'proxy-operator'; from service.cli import app; app()"


def tree_env(tree: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(tree),
        "PATH": f"{tree / '.tools' / 'bin'}:{VENV_BIN}:{os.environ['PATH']}",
        "PULUMI_CONFIG_PASSPHRASE": "bench",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        **extra,
    }


def import_rss(tree: Path) -> tuple[float, float]:
    """Median (bare interpreter, after `import service.cli`) VmRSS in MiB."""
    bare, after = [], []
    for _ in range(IMPORT_RUNS):
        out = subprocess.run(
            [sys.executable, "-c", RSS_SCRIPT], cwd=tree, env=tree_env(tree), capture_output=True, text=True
        )
        if out.returncode:
            raise SystemExit(f"import service.cli failed in {tree}:\n{out.stderr[-2000:]}")
        b, a = map(float, out.stdout.split())
        bare.append(b)
        after.append(a)
    return statistics.median(bare), statistics.median(after)


def vm_rss(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("VmRSS")) / 1024


def serve_rss(kube: KubeApi, tree: Path, work: Path, *, label: str, role: str) -> float:
    """Median VmRSS of `serve --kubeconfig` watching an empty namespace as `role`."""
    name = f"rss-{label}-{role}"
    namespace = name
    with kube.client() as api:
        request_json(api, "POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
        if role == "follower":  # held for the run by a leader that is not running
            record = LeaseRecord.first("absent-leader", now=datetime.now(UTC), duration=3600)
            write_lease(api, namespace=namespace, name=name, current=None, record=record, timeout=10)
    (work / f"backend-{name}").mkdir()
    env = tree_env(
        tree,
        PULUMI_HOME=str(work / "pulumi-home"),
        PULUMI_BACKEND_URL=(work / f"backend-{name}").as_uri(),
        PROXY_OPERATOR_KUBE_NAMESPACES=json.dumps([namespace]),
        PROXY_OPERATOR_KUBE_NAMESPACE=namespace,
        PROXY_OPERATOR_KUBE_IDENTITY=name,
        PROXY_OPERATOR_KUBE_LEASE_NAME=name,
    )
    log = work / f"{name}.log"
    argv = [sys.executable, "-c", SERVE, "serve", "--kubeconfig", str(kube.kubeconfig)]
    argv += ["--state-dir", str(work / f"state-{name}"), "--port", "0"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        )
    try:
        deadline = time.monotonic() + 120
        wanted = "first pass done" if role == "leader" else "API served by uvicorn"
        while wanted not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
                raise SystemExit(f"{name} did not reach {wanted!r}:\n{tail}")
            time.sleep(0.5)
        time.sleep(SETTLE)
        samples = []
        for _ in range(SAMPLES):
            samples.append(vm_rss(process.pid))
            time.sleep(1)
        text = log.read_text(errors="replace")
        if role == "follower" and "leading (term" in text:
            raise SystemExit(f"{name} led: the Lease was not held")
        return statistics.median(samples)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def main() -> None:
    print(f"trees: {', '.join(f'{label}={path}' for label, path in TREES)}; load {os.getloadavg()}")
    rows: dict[str, dict[str, float]] = {label: {} for label, _ in TREES}
    for label, tree in TREES:
        bare, after = import_rss(tree)
        rows[label]["bare interpreter"] = bare
        rows[label]["import service.cli"] = after
    with (
        tempfile.TemporaryDirectory(prefix="bench-rss-") as scratch,
        running_apiserver(Path(scratch)) as kube,
    ):
        with kube.client() as api:
            install_crds(api, ROOT / "crds", cache_dir=Path(scratch))
        for role in ("follower", "leader"):
            for label, tree in TREES:
                rows[label][f"{role} watching none"] = serve_rss(
                    kube, tree, Path(scratch), label=label, role=role
                )
                print(f"  {label} {role}: {rows[label][f'{role} watching none']:.1f} MiB", flush=True)
    first = TREES[0][0]
    print(f"\nVmRSS, MiB (median); ratio against {first}; load {os.getloadavg()}")
    for measure in rows[first]:
        cells = []
        for label, _ in TREES:
            value = rows[label][measure]
            cells.append(f"{label} {value:6.1f} ({value / rows[first][measure]:.2f}x)")
        print(f"  {measure:22s} " + "   ".join(cells))


if __name__ == "__main__":
    main()
