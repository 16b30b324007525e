"""Benchmark: planning 10,000 proxies in 20 stacks and 100,000 in 200, and the engine's overhead per `up`.

Prints figures and ratios against baselines measured in the same run; asserts nothing about time.
- plan from scratch (every proxy hashed, every stack planned) vs re-plan after one proxy changes (only its
  stack): the ratio shows that a change costs work proportional to its stack, not the fleet;
- the scale of the plan: one change at 100,000 proxies over 200 stacks against one at 10,000 over 20 (the
  same 500 proxies a stack; goal at most 1.2x), measured two ways: back to back ("hot": each change right
  after the last, so at 10,000 the planner's tables stay in the CPU's caches, at 100,000 they cannot), and
  "cold": before each change the bench writes through BENCH_EVICT_MIB (64) of memory, outside the timed
  part, as the service's other work (probes, leases, the watch) does between two changes of a Proxy;
- our `Engine.up` vs a bare Automation API `up` on the same program, stack and config (no changes).
`BENCH_UP=0` skips the `up` part (it needs the Pulumi CLI); `BENCH_CHANGES` (200) is how many one-proxy
changes a round makes, `BENCH_PLAN_ROUNDS` (3) how many steady rounds follow the first. The first round
after the intake is printed apart: its changes are the first to replace planned versions, and at 100,000
the allocator then takes fresh memory from the system (its upserts about 2x the later rounds' there, not
at 10,000), a one-off after an intake rather than what each change costs.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from automation.planner import Planner  # noqa: E402
from stacks.models import ProviderCatalogue, Proxy  # noqa: E402

SIZES = ((10_000, 20), (100_000, 200))  # (proxies, stacks): 500 proxies a stack at both
CHANGES = int(os.environ.get("BENCH_CHANGES", "200"))
ROUNDS = int(os.environ.get("BENCH_PLAN_ROUNDS", "3"))
EVICT = bytearray(int(os.environ.get("BENCH_EVICT_MIB", "64")) << 20)
GOAL = 1.2


def evict() -> None:
    """Write one byte of every cache line of a buffer larger than the caches: what the planner touched last
    is no longer cached."""
    EVICT[::64] = b"\x01" * (len(EVICT) // 64)


def make_fleet(count: int, stacks: int) -> tuple[ProviderCatalogue, list[Proxy]]:
    catalogue = ProviderCatalogue.model_validate(
        {"providers": [{"name": f"site-{i}", "type": "local"} for i in range(stacks)]}
    )
    proxies = [
        Proxy.model_validate(
            {
                "metadata": {"name": f"p{i}", "namespace": "crawl", "labels": {"tier": str(i % 3)}},
                "spec": {
                    "provider": f"site-{i % stacks}",
                    "port": 20000 + i % 40000,
                    "allowedSourceRanges": ["10.0.0.0/8"],
                },
            }
        )
        for i in range(count)
    ]
    return catalogue, proxies


def bench_planner(count: int, stacks: int) -> tuple[float, float, float, float]:
    """Prints the figures of one size; returns the median seconds of one change in the steady rounds,
    elapsed and the thread's CPU time (what another process's use of the cores changes least), of the
    first round's, and of one change with the caches evicted before it (elapsed)."""
    catalogue, proxies = make_fleet(count, stacks)
    started = time.perf_counter()
    planner = Planner()
    planner.set_catalogue(catalogue)
    for proxy in proxies:
        planner.upsert(proxy)
    plans = planner.plan_all()
    scratch = time.perf_counter() - started
    assert sum(len(p.proxies) for p in plans.values()) == count
    del plans
    gc.collect()
    rounds = []
    for round_no in range(1 + ROUNDS):  # the first changes after the intake, then the steady rounds
        samples, cpu = [], []
        for i in range(CHANGES):
            changed = proxies[(i * 7919 + round_no) % count].model_copy(deep=True)
            changed.spec.port += 1 + round_no
            started, started_cpu = time.perf_counter(), time.thread_time()
            for stack in planner.upsert(changed):
                planner.plan(stack)
            cpu.append(time.thread_time() - started_cpu)
            samples.append(time.perf_counter() - started)
        rounds.append((samples, cpu))
    cold = []
    for i in range(CHANGES):  # each change after the caches were evicted
        changed = proxies[(i * 7919 + 1 + ROUNDS) % count].model_copy(deep=True)
        changed.spec.port += 2 + ROUNDS
        evict()
        started = time.perf_counter()
        for stack in planner.upsert(changed):
            planner.plan(stack)
        cold.append(time.perf_counter() - started)
    first = statistics.median(rounds[0][0])
    steady = [x for samples, _ in rounds[1:] for x in samples]
    steady_cpu = [x for _, cpu in rounds[1:] for x in cpu]
    replan, replan_cpu = statistics.median(steady), statistics.median(steady_cpu)
    print(f"plan from scratch: {count} proxies in {stacks} stacks: {scratch * 1000:.0f} ms")
    print(
        f"  re-plan after one change (its stack of {count // stacks}): {replan * 1000:.3f} ms "
        f"(median of {len(steady)} over {ROUNDS} rounds; "
        f"p90 {statistics.quantiles(steady, n=10)[8] * 1000:.3f} ms), CPU {replan_cpu * 1000:.3f} ms; "
        f"the first {CHANGES} changes after the intake: {first * 1000:.3f} ms; "
        f"cold (caches evicted before each): {statistics.median(cold) * 1000:.3f} ms"
    )
    print(f"  ratio scratch / one change: {scratch / replan:.0f}x (fleet/stack size = {stacks}x)")
    return replan, replan_cpu, first, statistics.median(cold)


def bench_scale() -> None:
    (small, small_stacks), (large, large_stacks) = SIZES
    one, one_cpu, one_first, one_cold = bench_planner(small, small_stacks)
    gc.collect()
    many, many_cpu, many_first, many_cold = bench_planner(large, large_stacks)
    print(
        f"scale of the plan: one change at {large} over {large_stacks} stacks / at {small} over "
        f"{small_stacks}: cold {many_cold / one_cold:.2f}x (goal at most {GOAL}); back to back "
        f"{many / one:.2f}x elapsed, {many_cpu / one_cpu:.2f}x CPU; the first changes after the intake "
        f"{many_first / one_first:.2f}x"
    )


def bench_up_overhead(rounds: int = int(os.environ.get("BENCH_UP_ROUNDS", "5"))) -> None:
    from pulumi import automation as auto

    from automation.engine import Engine, EngineConfig
    from automation.planner import Planner as _Planner
    from automation.stack_input import resolve_stack

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "backend").mkdir()
        os.environ["PATH"] = f"{ROOT / '.tools' / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}"
        config = EngineConfig(
            backend_url=(tmp_path / "backend").as_uri(), state_dir=tmp_path / "state", passphrase="bench"
        )
        engine = Engine(config)
        catalogue = ProviderCatalogue.model_validate(
            {"providers": [{"name": "bench", "type": "local", "stateDir": str(tmp_path / "local")}]}
        )
        planner = _Planner()
        planner.set_catalogue(catalogue)
        planner.upsert(
            Proxy.model_validate(
                {
                    "metadata": {"name": "b0", "namespace": "bench"},
                    "spec": {"provider": "bench", "port": 0 + 28999, "allowedSourceRanges": ["127.0.0.0/8"]},
                }
            )
        )
        spec = resolve_stack(planner.plan("bench"), credentials=_NoSecrets()).input
        engine.up(spec)  # create once; the measured runs change nothing
        # the same work dir, program and config: only our layer differs
        workspace = engine._workspace("bench")
        pairs = []
        for _ in range(rounds):  # interleaved, so that a change in the machine's load hits both alike
            pairs.append(
                (
                    _timed(lambda: engine.up(spec), 1),
                    _timed(lambda: auto.Stack.select("bench", workspace).up(), 1),
                )
            )
        engine.destroy("bench")
    ours = statistics.median(p[0] for p in pairs)
    bare = statistics.median(p[1] for p in pairs)
    ratio = statistics.median(p[0] / p[1] for p in pairs)
    print(
        f"up, nothing to change: bare Automation API {bare:.2f} s, ours {ours:.2f} s "
        f"(median of {rounds}, interleaved); overhead {ours - bare:+.2f} s, ratio {ratio:.2f} (median of "
        "the rounds' ratios)"
    )


class _NoSecrets:
    def credentials_for(self, proxy: Proxy) -> None:
        return None

    def secret_value(self, name: str, key: str) -> None:
        return None


def _timed(fn, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


if __name__ == "__main__":
    bench_scale()
    if os.environ.get("BENCH_UP", "1") != "0":
        bench_up_overhead()
