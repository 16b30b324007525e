"""Benchmark: the `local` provider's shared listener (`processModel: shared`) against a process per proxy
(`make bench`; asserts nothing). Issue 20: 10,000 running `local` proxies do not fit this machine as
10,000 processes; one listener process serving many ports does.

1. Idle: one shared listener (`python -m stacks.forward_proxy --shared SOCK`) serving BENCH_PORTS
   (1,000 and 10,000) proxies on loopback, each its own port (chosen by the kernel), credentials and egress
   policy, added over its control socket as the provider adds them. Its VmRSS, PSS and open descriptors,
   the time to add them, then two per-proxy costs the service and the engine pay: the probe gate
   (`identity.listener_refusal`, before every probe of a local endpoint) and the provider's `read`
   (`status` over the socket, at every refresh). Baseline, in the same run: one proxy in its own process
   (`python -m stacks.forward_proxy CONFIG`), idle, and the gate on it.
2. `up`: one stack of BENCH_UP_SHARED (1,000) proxies in the shared mode through the real engine (bare
   Automation API, a file backend in a temp folder) against BENCH_UP_PER (50) in a process each (what fits
   here) and the same 50 shared: seconds per proxy, and the ratio to the per-process figure.

Run alone: `PYTHONPATH=. .venv/bin/python tests/bench/bench_local_shared.py` (with `.tools/bin` on PATH;
`BENCH_PORTS=1000,10000`, `BENCH_UP_SHARED`, `BENCH_UP_PER`, `BENCH_GATE_CHECKS`; `BENCH_UP_SHARED=0`
skips part 2). Figures: docs/operations.md, "The shared listener of local proxies".
"""

from __future__ import annotations

import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from stacks.forward_proxy.config import ProxyConfig  # noqa: E402
from stacks.forward_proxy.identity import ProcessRef, holds_listener_uncached, listener_refusal  # noqa: E402
from stacks.models import EgressSpec  # noqa: E402
from stacks.programs import local_process as proc  # noqa: E402
from stacks.programs.local_listener import SharedListener  # noqa: E402
from tests.ports import free_port  # noqa: E402

PORTS = [int(n) for n in os.environ.get("BENCH_PORTS", "1000,10000").split(",") if n]
UP_SHARED = int(os.environ.get("BENCH_UP_SHARED", "1000"))
UP_PER = int(os.environ.get("BENCH_UP_PER", "50"))
GATE_CHECKS = int(os.environ.get("BENCH_GATE_CHECKS", "200"))
MIB = 1024 * 1024


def _kib(pid: int, path: str, field: str) -> int:
    for line in Path(f"/proc/{pid}/{path}").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _memory(pid: int) -> dict[str, float]:
    return {
        "rss": _kib(pid, "status", "VmRSS") / 1024,
        "pss": _kib(pid, "smaps_rollup", "Pss") / 1024,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def _nofile(pid: int) -> str:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return "/".join(line.split()[3:5])
    return "?"


def _config(i: int, port: int) -> ProxyConfig:
    egress = EgressSpec.model_validate({"allow": [{"cidr": "127.0.0.1/32", "ports": [8000 + i % 1000]}]})
    return ProxyConfig(
        bind="127.0.0.1", port=port, protocol="http", egress=egress, username=f"u{i}", password=f"p{i}-secret"
    )


def _gate_us(ref: ProcessRef, ports: list[int]) -> float:
    sample = [random.choice(ports) for _ in range(GATE_CHECKS)]
    assert listener_refusal(ref, port=sample[0]) is None  # the one scan that fills in every port
    started = time.perf_counter()
    for port in sample:
        assert listener_refusal(ref, port=port) is None
    return (time.perf_counter() - started) / len(sample) * 1e6


def _scan_us(ref: ProcessRef, ports: list[int]) -> float:
    """The gate's descriptor check as it was before it remembered (every descriptor, the table)."""
    sample = [random.choice(ports) for _ in range(max(5, GATE_CHECKS // 10))]
    started = time.perf_counter()
    for port in sample:
        assert holds_listener_uncached(ref.pid, port)
    return (time.perf_counter() - started) / len(sample) * 1e6


def _baseline(tmp: Path) -> tuple[dict[str, float], float, float]:
    """One proxy in its own process, idle: its memory and the gate on it."""
    port = free_port()
    config_file = tmp / "one.json"
    _config(0, port).write(config_file)
    ref = proc.spawn(proc.proxy_command(config_file), log_path=tmp / "one.log")
    try:
        proc.wait_until_listening(ref, host="127.0.0.1", port=port, log_path=tmp / "one.log")
        time.sleep(0.5)
        return _memory(ref.pid), _gate_us(ref, [port]), _scan_us(ref, [port])
    finally:
        proc.stop(ref)


def _idle(tmp: Path, count: int) -> dict[str, Any]:
    state = tmp / f"idle-{count}"
    state.mkdir(mode=0o700)
    listener = SharedListener(state, "bench")
    with listener.locked():
        ref = listener.ensure()
    ports = []
    try:
        started = time.perf_counter()
        for i in range(count):
            path = state / f"p{i}.json"
            _config(i, 0).write(path)
            ports.append(listener.call({"op": "serve", "proxy": f"bench/p{i}", "config": str(path)})["port"])
        added = time.perf_counter() - started
        time.sleep(1.0)
        memory = _memory(ref.pid)
        gate, scan = _gate_us(ref, ports), _scan_us(ref, ports)
        started = time.perf_counter()
        for port_index in random.sample(range(count), min(count, GATE_CHECKS)):
            listener.call({"op": "status", "proxy": f"bench/p{port_index}"})
        status = (time.perf_counter() - started) / min(count, GATE_CHECKS) * 1e6
        return {
            "count": count,
            "added": added,
            **memory,
            "gate": gate,
            "scan": scan,
            "status": status,
            "nofile": _nofile(ref.pid),
        }
    finally:
        listener.stop(ref)


def _engine_env(tmp: Path) -> None:
    (tmp / "backend").mkdir()
    (tmp / "home").mkdir()
    os.environ["PATH"] = f"{ROOT / '.tools' / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    os.environ |= {
        "PULUMI_HOME": str(tmp / "home"),
        "PULUMI_BACKEND_URL": (tmp / "backend").as_uri(),
        "PULUMI_CONFIG_PASSPHRASE": "bench",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PYTHONPATH": str(ROOT),
    }


def _up(tmp: Path, *, name: str, count: int, model: str) -> tuple[float, float]:
    """(seconds of the `up` that creates `count` proxies, seconds of the destroy)."""
    from pulumi import automation as auto

    work = tmp / name
    work.mkdir()
    (work / "Pulumi.yaml").write_text(f"name: proxy-operator\nruntime: python\nmain: {ROOT / 'stacks'}\n")
    stack = auto.create_or_select_stack(stack_name=name, work_dir=str(work))
    entry = {"name": name, "type": "local", "stateDir": str(tmp / f"{name}-state"), "processModel": model}
    proxies = [
        {"namespace": "bench", "name": f"p{i}", "labels": {}, "spec": {"provider": name, "port": free_port()}}
        for i in range(count)
    ]
    stack.set_config("proxy-operator:provider", auto.ConfigValue(json.dumps(entry)))
    stack.set_config("proxy-operator:proxies", auto.ConfigValue(json.dumps(proxies)))
    started = time.perf_counter()
    try:
        stack.up()
        up = time.perf_counter() - started
    except auto.CommandError as exc:  # say why, then clean up: the other figures still print
        up = float("nan")
        print(
            f"up of {count} ({model}) failed after {time.perf_counter() - started:.0f} s: {str(exc)[-2000:]}"
        )
    finally:
        started = time.perf_counter()
        stack.destroy()
    return up, time.perf_counter() - started


def _print_idle(
    base: dict[str, float], base_gate: float, base_scan: float, rows: list[dict[str, Any]]
) -> None:
    print(
        f"one proxy in its own process, idle: RSS {base['rss']:.1f} MiB, PSS {base['pss']:.1f} MiB, "
        f"{base['fds']} fds; probe gate {base_gate:.0f} us (without its memory {base_scan:.0f} us)"
    )
    for row in rows:
        per_port = (row["rss"] - base["rss"]) * 1024 / row["count"]  # above one idle proxy process
        print(
            f"shared listener, {row['count']:,} ports idle: RSS {row['rss']:.1f} MiB ({per_port:.1f} KiB "
            f"more a port; {row['count'] * base['rss'] / row['rss']:.0f}x less than a process each), "
            f"PSS {row['pss']:.1f} MiB, "
            f"{row['fds']:,} fds (limit {row['nofile']}); added in {row['added']:.1f} s "
            f"({row['count'] / row['added']:.0f}/s); probe gate {row['gate']:.0f} us "
            f"({row['gate'] / base_gate:.1f}x one process's; without its memory {row['scan']:.0f} us, "
            f"{row['scan'] / base_scan:.1f}x); read (status) {row['status']:.0f} us"
        )  # fmt: skip


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[attr-defined]  # part 2 takes minutes
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"shared machine: {os.cpu_count()} cores; RLIMIT_NOFILE here {limit}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-shared-") as name:
        tmp = Path(name)
        base, base_gate, base_scan = _baseline(tmp)
        _print_idle(base, base_gate, base_scan, [_idle(tmp, count) for count in PORTS])
        if UP_SHARED <= 0:
            return
        _engine_env(tmp)
        per_up, per_down = _up(tmp, name="per", count=UP_PER, model="perProxy")
        small_up, small_down = _up(tmp, name="small", count=UP_PER, model="shared")
        big_up, big_down = _up(tmp, name="big", count=UP_SHARED, model="shared")
    per = per_up / UP_PER
    print(
        f"up, {UP_PER} proxies, a process each: {per_up:.1f} s ({per * 1000:.0f} ms a proxy; "
        f"destroy {per_down:.1f} s)"
    )
    for count, up, down in ((UP_PER, small_up, small_down), (UP_SHARED, big_up, big_down)):
        print(
            f"up, {count} proxies, shared: {up:.1f} s ({up / count * 1000:.0f} ms a proxy, "
            f"{up / count / per:.2f}x the per-process figure; destroy {down:.1f} s)"
        )  # fmt: skip


if __name__ == "__main__":
    main()
