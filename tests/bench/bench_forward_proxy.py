"""Benchmark: our forward proxy against Debian's tinyproxy and dante (`make bench`; asserts nothing).

Issue 19: before choosing the proxy daemon in pods and KVM guests, "measure its throughput against a
Debian-packaged proxy (tinyproxy, squid or dante)". Real processes on 127.0.0.1, each in its own process:
our proxy (`python -m stacks.forward_proxy CONFIG.json`, egress allowing the sinks' ports on 127.0.0.1, a
static Basic user and a control socket, so lease users are on), once for HTTP and once for SOCKS5;
tinyproxy 1.11 (`tinyproxy -d -c FILE`, ConnectPort for the sinks, BasicAuth, MaxClients 1000); dante 1.4
(`danted -f FILE`, SOCKS5 without authentication: dante's `username` method reads the system's password
database and its `pam` method a service file in /etc/pam.d (the KVM guests' pam_pwdfile), neither of which a
bench should add to the machine; so our SOCKS5 proxy runs without a user too). dante starts
as root, as Debian's unit starts it, its workers running as `nobody` as in Debian's danted.conf (the bench
runs as root here; without root the dante rows are skipped), and forks about 20 processes: its CPU and
memory are summed over the tree.

1. Bulk: a sink that sends BENCH_MIB (256) MiB on each connection and closes; a client process with
   BENCH_TUNNELS (4) threads, each opening a tunnel (HTTP CONNECT, or SOCKS5 CONNECT) and reading to the end.
   MiB/s over all tunnels, and the proxy's CPU seconds (utime+stime from /proc/PID/stat, before and after)
   per GiB (1 GiB a run: with 64 MiB a tunnel a run lasted 0.15 s, 15 ticks of the 10 ms CPU clock).
   Direct (the client to the sink, no proxy) is the baseline: what loopback, the sink and the client give
   on this machine.
2. Small requests: a sink that answers one request with BENCH_BODY (1,024) bytes and closes; an asyncio
   client process with BENCH_CONCURRENCY (50) workers, each CONNECT (with Basic credentials) -> request ->
   answer -> close, in a loop for BENCH_SECONDS (4). Requests/s and proxy CPU per 1,000 requests; direct
   as above. The client is Python too and shares the 2 cores: its CPU is printed, and when it is near one
   core the requests/s figure is the client's ceiling as much as the proxy's; the summary also gives what
   each proxy does per CPU second it spends (MiB, requests), which does not depend on who was the ceiling.
3. Memory: each proxy's VmRSS (and PSS, /proc/PID/smaps_rollup, which shares dante's common pages out
   among its processes) right after it started, and the largest seen under the small-requests load.

BENCH_RUNS (3) rounds, fresh proxies each round; the figures are medians, ratios taken within each round
(the machine is shared with other work). Figures and what they mean: docs/decisions.md, "The proxy in pods
and VMs (issue 19)"; how to run it: docs/operations.md.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import socketserver
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.ports import free_port  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_abuse import _wait_listening  # noqa: E402

PY = sys.executable
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "4"))
MIB = int(os.environ.get("BENCH_MIB", "256"))
TUNNELS = int(os.environ.get("BENCH_TUNNELS", "4"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "50"))
BODY = int(os.environ.get("BENCH_BODY", "1024"))
USER, PASSWORD = "bench", os.environ.get("BENCH_PASSWORD") or secrets.token_urlsafe(12)
PR_SET_CHILD_SUBREAPER = 36
Process = subprocess.Popen[bytes]
Result = dict[str, Any]


# --- the sinks and the clients (child processes: `bench_forward_proxy.py ROLE ARG`) ---
class _Bulk(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        chunk = memoryview(bytes(1 << 20))
        for _ in range(MIB):
            self.request.sendall(chunk)
        self.request.shutdown(socket.SHUT_WR)


def sink_bulk(port: int) -> None:
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    socketserver.ThreadingTCPServer.request_queue_size = 128
    with socketserver.ThreadingTCPServer(("127.0.0.1", port), _Bulk) as server:
        server.serve_forever()


async def sink_small(port: int) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % BODY + b"x" * BODY

    async def page(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(page, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def _connect_request(kind: str, port: int) -> bytes:
    """What opens a tunnel to 127.0.0.1:port: an HTTP CONNECT head, or a SOCKS5 greeting and request."""
    if kind == "socks5":
        return b"\x05\x01\x00" + b"\x05\x01\x00\x01" + socket.inet_aton("127.0.0.1") + struct.pack("!H", port)
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    return f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode() + (
        f"Proxy-Authorization: Basic {basic}\r\n\r\n".encode()
    )


def _handshake(sock: socket.socket, kind: str, port: int) -> bytes:
    """Open the tunnel; return the bytes of the far side that came with the proxy's answer."""
    sock.sendall(_connect_request(kind, port))
    data = b""
    while True:
        if kind == "http" and b"\r\n\r\n" in data:
            head, rest = data.split(b"\r\n\r\n", 1)
            if b" 200 " not in head.split(b"\r\n", 1)[0] + b" ":
                raise ConnectionError(head.decode(errors="replace"))
            return rest
        if kind == "socks5" and len(data) >= 12:  # method choice (2) + reply with an IPv4 address (10)
            if data[:2] != b"\x05\x00" or data[3] != 0 or data[5] != 1:
                raise ConnectionError(f"SOCKS5 answered {data[:12]!r}")
            return data[12:]
        more = sock.recv(65536)
        if not more:
            raise ConnectionError(f"closed during the handshake after {data!r}")
        data += more


def client_bulk(spec: dict[str, Any]) -> None:
    """TUNNELS tunnels at once, each read to its end; prints bytes, seconds and the client's CPU."""
    received = [0] * TUNNELS
    start = threading.Barrier(TUNNELS + 1)

    def tunnel(i: int) -> None:
        start.wait()
        with socket.create_connection(("127.0.0.1", spec["port"])) as sock:
            if spec["kind"] != "direct":
                received[i] = len(_handshake(sock, spec["kind"], spec["target"]))
            buffer = bytearray(1 << 20)
            while n := sock.recv_into(buffer):
                received[i] += n

    threads = [threading.Thread(target=tunnel, args=(i,)) for i in range(TUNNELS)]
    for thread in threads:
        thread.start()
    began = time.monotonic()
    start.wait()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - began
    print(json.dumps({"bytes": sum(received), "seconds": seconds, "cpu": time.process_time()}))


async def client_small(spec: dict[str, Any]) -> None:
    """CONCURRENCY workers, each request after request for SECONDS; prints counts and the client's CPU."""
    counts = {"ok": 0, "errors": 0}
    request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    tunnel = _connect_request("http", spec["target"]) if spec["kind"] == "http" else b""

    async def once() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", spec["port"])
        try:
            if tunnel:
                writer.write(tunnel)
                head = await reader.readuntil(b"\r\n\r\n")
                if b" 200 " not in head.split(b"\r\n", 1)[0] + b" ":
                    raise ConnectionError(head)
            writer.write(request)
            answer = await reader.read()
            if len(answer) < BODY:
                raise ConnectionError(answer)
        finally:
            writer.close()

    async def worker(deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                await once()
                counts["ok"] += 1
            except (OSError, ConnectionError, asyncio.IncompleteReadError):
                counts["errors"] += 1

    began = time.monotonic()
    await asyncio.gather(*(worker(began + SECONDS) for _ in range(CONCURRENCY)))
    print(json.dumps(counts | {"seconds": time.monotonic() - began, "cpu": time.process_time()}))


# --- processes: starting, stopping, what they cost ---
def _child(*args: str, output: bool = False) -> Process:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the BENCH_* knobs and the password reach the children
    env["BENCH_PASSWORD"] = PASSWORD
    out = subprocess.PIPE if output else subprocess.DEVNULL
    return subprocess.Popen(list(args), cwd=ROOT, env=env, stdout=out, stderr=subprocess.DEVNULL)


def _tree(pid: int) -> list[int]:
    """pid and its descendants (dante forks its workers)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(parents.get(found[-1], []))
    return found


def _stop(*processes: Process) -> None:
    """SIGTERM each and its descendants, then reap them (the bench is their subreaper: dante's mother
    exits before its workers)."""
    pids = [p for process in processes if process.poll() is None for p in _tree(process.pid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    deadline = time.monotonic() + 10
    for pid in pids:
        while True:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] or time.monotonic() > deadline:
                    break
            except ChildProcessError:
                break  # not ours to reap (its own parent did), or already reaped
            time.sleep(0.02)


def _cpu(pid: int) -> float:
    """CPU seconds of pid and its descendants so far, with the children they reaped (/proc)."""
    total = 0
    for each in _tree(pid):
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def _memory(pid: int) -> tuple[float, float]:
    """MiB resident (VmRSS) and proportional (Pss) of pid and its descendants."""
    rss = pss = 0
    for each in _tree(pid):
        try:
            status = Path(f"/proc/{each}/status").read_text()
            rollup = Path(f"/proc/{each}/smaps_rollup").read_text()
        except OSError:
            continue
        rss += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        pss += next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:"))
    return rss / 1024, pss / 1024


# --- the proxies ---
@dataclass(frozen=True)
class Proxy:
    name: str
    kind: str  # "http", "socks5" or "direct" (no proxy)
    port: int
    process: Process | None


def _ours(folder: Path, protocol: str, targets: list[int]) -> Proxy:
    from stacks.forward_proxy.config import Limits, ProxyConfig
    from stacks.models import EgressSpec

    egress = EgressSpec.model_validate({"allow": [{"cidr": "127.0.0.1/32", "ports": targets}]})
    port, name = free_port(), f"ours-{protocol}"
    config = ProxyConfig(
        bind="127.0.0.1", port=port, protocol=protocol, egress=egress, control=str(folder / f"{name}.ctl"),
        username=USER if protocol == "http" else None, password=PASSWORD if protocol == "http" else None,
        limits=Limits(total=4096),
    )  # fmt: skip
    config.write(folder / f"{name}.json")
    process = _child(PY, "-m", "stacks.forward_proxy", str(folder / f"{name}.json"))
    return Proxy(f"ours ({protocol})", protocol, port, process)


def _tinyproxy(folder: Path, targets: list[int]) -> Proxy:
    port = free_port()
    lines = [f"Port {port}", "Listen 127.0.0.1", "Timeout 600", "MaxClients 1000"]
    lines += [f"BasicAuth {USER} {PASSWORD}", *(f"ConnectPort {t}" for t in targets)]
    lines += [f'PidFile "{folder}/tinyproxy.pid"', f'LogFile "{folder}/tinyproxy.log"', "LogLevel Critical"]
    (folder / "tinyproxy.conf").write_text("\n".join(lines) + "\n")
    return Proxy("tinyproxy", "http", port, _child("tinyproxy", "-d", "-c", str(folder / "tinyproxy.conf")))


def _dante(folder: Path, target: int) -> Proxy:
    port = free_port()
    (folder / "danted.conf").write_text(
        f"logoutput: {folder}/danted.log\ninternal: 127.0.0.1 port = {port}\nexternal: 127.0.0.1\n"
        "clientmethod: none\nsocksmethod: none\nuser.privileged: root\nuser.unprivileged: nobody\n"
        "client pass { from: 127.0.0.0/8 to: 0.0.0.0/0 }\n"
        f"socks pass {{ from: 127.0.0.0/8 to: 127.0.0.1/32 port = {target}\n command: connect }}\n"
    )
    process = _child("danted", "-f", str(folder / "danted.conf"), "-p", str(folder / "danted.pid"))
    return Proxy("dante", "socks5", port, process)


def start_proxies(folder: Path, bulk: int, small: int) -> list[Proxy]:
    proxies = [_ours(folder, "http", [bulk, small]), _ours(folder, "socks5", [bulk])]
    if shutil.which("tinyproxy"):
        proxies.insert(1, _tinyproxy(folder, [bulk, small]))
    if shutil.which("danted") and os.geteuid() == 0:
        proxies.append(_dante(folder, bulk))
    try:
        for proxy in proxies:
            assert proxy.process is not None
            _wait_listening(proxy.port, proxy.process, proxy.name)
    except BaseException:
        _stop(*(p.process for p in proxies if p.process is not None))
        raise
    time.sleep(0.5)  # dante's workers are forked after it listens
    return proxies


# --- one measurement ---
def _load(role: str, proxy: Proxy, target: int) -> tuple[Result, float, tuple[float, float]]:
    """Run one client process through proxy; its result, the proxy's CPU seconds, its largest memory."""
    spec = json.dumps({"kind": proxy.kind, "port": proxy.port, "target": target})
    pid = proxy.process.pid if proxy.process else None
    before = _cpu(pid) if pid else 0.0
    client = _child(PY, __file__, role, spec, output=True)
    peak = (0.0, 0.0)
    while pid and client.poll() is None:
        peak = max(peak, _memory(pid))
        time.sleep(0.2)
    result: Result = json.loads(client.communicate(timeout=SECONDS + 120)[0])
    return result, (_cpu(pid) - before if pid else 0.0), peak


def _bulk(proxy: Proxy, port: int) -> Result:
    idle = _memory(proxy.process.pid) if proxy.process else (0.0, 0.0)
    got, cpu, _ = _load("client-bulk", proxy, port)
    gib = got["bytes"] / 2**30
    return {"idle": idle, "mibs": gib * 1024 / got["seconds"], "cpu_gib": cpu / gib}


def _small(proxy: Proxy, port: int) -> Result:
    got, cpu, peak = _load("client-small", proxy, port)
    found: Result = {"rps": got["ok"] / got["seconds"], "errors": got["errors"], "loaded": peak}
    return found | {"cpu_k": cpu / max(got["ok"], 1) * 1000, "client_small": got["cpu"] / got["seconds"]}


def one_round(folder: Path, bulk: int, small: int) -> dict[str, Result]:
    """Fresh proxies; bulk through each (and direct), small requests through each HTTP one (and direct)."""
    proxies = start_proxies(folder, bulk, small)
    found: dict[str, Result] = {"direct": _bulk(Proxy("direct", "direct", bulk, None), bulk)}
    found["direct"] |= _small(Proxy("direct", "direct", small, None), small)
    try:
        for proxy in proxies:
            found[proxy.name] = _bulk(proxy, bulk) | (_small(proxy, small) if proxy.kind == "http" else {})
    finally:
        _stop(*(p.process for p in proxies if p.process is not None))
    return found


# --- figures ---
def _line(name: str, r: Result) -> str:
    line = f"  {name:15s} bulk {r['mibs']:7.0f} MiB/s, proxy CPU {r['cpu_gib']:5.2f} s/GiB"
    if "rps" in r:
        line += f"; small {r['rps']:6.0f} req/s, proxy CPU {r['cpu_k']:5.3f} s/1000"
        line += f", client CPU {r['client_small']:.0%}" + (f", {r['errors']} errors" if r["errors"] else "")
    if r["idle"][0]:
        line += f"\n  {'':15s} memory RSS/PSS idle {r['idle'][0]:5.1f}/{r['idle'][1]:5.1f} MiB"
        if "rps" in r:
            line += f", under the small load {r['loaded'][0]:5.1f}/{r['loaded'][1]:5.1f} MiB"
    return line


def _median(rounds: list[dict[str, Result]], name: str) -> Result:
    keys = rounds[0][name]
    return {
        k: tuple(statistics.median(r[name][k][i] for r in rounds) for i in range(2))
        if isinstance(keys[k], tuple) else statistics.median(r[name][k] for r in rounds)
        for k in keys
    }  # fmt: skip


def _ratio(rounds: list[dict[str, Result]], key: str, a: str, b: str) -> float:
    return statistics.median(r[a][key] / r[b][key] for r in rounds if r[b][key])


def _summary(rounds: list[dict[str, Result]]) -> None:
    print(f" median of {len(rounds)} rounds (ratios taken within each round; the machine is shared):")
    for name in rounds[0]:
        print(_line(name, _median(rounds, name)))
    pairs = [("ours (http)", "tinyproxy"), ("ours (socks5)", "dante")]
    for ours, theirs in ((a, b) for a, b in pairs if b in rounds[0]):
        line = f"  => {ours} / {theirs}: bulk MiB/s {_ratio(rounds, 'mibs', ours, theirs):.2f}, "
        line += f"CPU per GiB {_ratio(rounds, 'cpu_gib', ours, theirs):.1f}"
        if "rps" in rounds[0][theirs]:
            line += f"; small req/s {_ratio(rounds, 'rps', ours, theirs):.2f}, "
            line += f"CPU per 1000 {_ratio(rounds, 'cpu_k', ours, theirs):.1f}"
        print(line)
    for name in (n for n in rounds[0] if n != "direct"):
        mib = statistics.median(1024 / r[name]["cpu_gib"] for r in rounds if r[name]["cpu_gib"])
        line = f"  => {name} per proxy CPU second: {mib:.0f} MiB"
        if "rps" in rounds[0][name]:
            requests = statistics.median(1000 / r[name]["cpu_k"] for r in rounds if r[name]["cpu_k"])
            line += f", {requests:.0f} requests"
        print(line)
    for name in ("ours (http)", "ours (socks5)"):
        print(f"  => {name} / direct: bulk MiB/s {_ratio(rounds, 'mibs', name, 'direct'):.2f}")


def main() -> None:
    began = time.monotonic()
    print(
        "forward proxy on loopback: ours vs tinyproxy (HTTP CONNECT, Basic auth), dante (SOCKS5, no auth); "
        f"bulk {TUNNELS} tunnels x {MIB} MiB, small {BODY} B requests at concurrency {CONCURRENCY} for "
        f"{SECONDS:g} s, {RUNS} rounds"
    )
    for missing in [n for n in ("tinyproxy", "danted") if not shutil.which(n)]:
        print(f" ({missing} not installed: its rows are skipped; scripts/install-system-deps.sh bench)")
    if os.geteuid() != 0 and shutil.which("danted"):
        print(" (not root: dante is started as root, as Debian's unit does; its rows are skipped)")
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # dante's orphaned workers: ours to reap
    bulk, small = free_port(), free_port()
    sinks = [_child(PY, __file__, "sink-bulk", str(bulk)), _child(PY, __file__, "sink-small", str(small))]
    rounds: list[dict[str, Result]] = []
    try:
        for port, sink in zip((bulk, small), sinks, strict=True):
            _wait_listening(port, sink, "sink")
        with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
            for round_no in range(RUNS):
                rounds.append(one_round(Path(tmp), bulk, small))
                print(f" round {round_no + 1}")
                for name, result in rounds[-1].items():
                    print(_line(name, result))
    finally:
        _stop(*sinks)
    _summary(rounds)
    print(f" ({time.monotonic() - began:.0f} s in all)")


if __name__ == "__main__":
    roles = {"sink-bulk": lambda a: sink_bulk(int(a)), "client-bulk": lambda a: client_bulk(json.loads(a))}
    roles["sink-small"] = lambda a: asyncio.run(sink_small(int(a)))
    roles["client-small"] = lambda a: asyncio.run(client_small(json.loads(a)))
    if len(sys.argv) == 3 and sys.argv[1] in roles:
        roles[sys.argv[1]](sys.argv[2])
    else:
        main()
