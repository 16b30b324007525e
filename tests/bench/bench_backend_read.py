"""Benchmark: the backend read a new term starts with (every stack's owner tag and outputs), one stack after
the other against across stacks at once.

BENCH_STACKS (default 20, the design's fleet) `local` stacks in a file backend, each made by one `up` with no
proxy (a read reads their tags and outputs: the CLI calls are the same for a stack of 500 proxies, only the
outputs are longer). Each round builds a fresh control loop (`Controller`, its reconciler knowing nothing)
over a manifests folder naming the stacks and times its backend read (`_load_backend`) with `max_parallel`
1 (the serial read this replaced: the same calls, one stack after the other), 4 (the default) and 8.
Median of BENCH_ROUNDS (3) each, ratios against the serial read of the same run; asserts nothing.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from automation.engine import Engine, StackInput  # noqa: E402
from service.config import OperatorSettings  # noqa: E402
from service.controller import Controller  # noqa: E402
from service.inventory import Inventory  # noqa: E402
from service.sources.directory import DirectorySource  # noqa: E402
from stacks.models import ProviderCatalogue  # noqa: E402

STACKS = int(os.environ.get("BENCH_STACKS", "20"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
PARALLEL = (1, 4, 8)


def settings(tmp: Path, parallel: int) -> OperatorSettings:
    return OperatorSettings(
        state_dir=tmp / "state",
        backend_url=(tmp / "backend").as_uri(),
        installation="bench",
        max_parallel=parallel,
        resync_seconds=0,
    )


def catalogue_entries(tmp: Path, names: list[str]) -> list[dict[str, str]]:
    return [{"name": n, "type": "local", "stateDir": str(tmp / "local" / n)} for n in names]


def make_stacks(tmp: Path, names: list[str]) -> None:
    """One `up` with no proxy per stack, four at a time (setting up, not measured)."""
    engine = Engine(settings(tmp, 4).engine_config())
    catalogue = ProviderCatalogue.model_validate({"providers": catalogue_entries(tmp, names)})

    async def up(name: str, limit: asyncio.Semaphore) -> None:
        entry = catalogue.get(name)
        assert entry is not None
        spec = StackInput(name=name, provider_json=entry.model_dump_json(by_alias=True), proxies_json="[]")
        async with limit:
            await asyncio.to_thread(engine.up, spec)

    async def all_stacks() -> None:
        limit = asyncio.Semaphore(4)
        await asyncio.gather(*(up(name, limit) for name in names))

    asyncio.run(all_stacks())


def read_once(tmp: Path, manifests: Path, parallel: int) -> tuple[float, int]:
    """Seconds of one fresh control loop's backend read, and how many stacks it read."""
    config = settings(tmp, parallel)
    controller = Controller(
        settings=config,
        engine=Engine(config.engine_config()),
        source=DirectorySource(manifests),
        inventory=Inventory(),
    )

    async def read() -> float:
        controller.sync()  # the catalogue first, as `start` does
        started = time.perf_counter()
        await controller._load_backend()
        elapsed = time.perf_counter() - started
        await controller.close(grace=5)
        return elapsed

    elapsed = asyncio.run(read())
    assert controller.backend_seen, "the backend read failed"
    return elapsed, len(controller.reconciler._applied)


def run(tmp: Path) -> None:
    (tmp / "backend").mkdir()
    os.environ["PATH"] = f"{ROOT / '.tools' / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    os.environ.setdefault("PULUMI_CONFIG_PASSPHRASE", "bench")
    names = [f"s{i:02d}" for i in range(STACKS)]
    started = time.perf_counter()
    make_stacks(tmp, names)
    print(f"{STACKS} stacks made in {time.perf_counter() - started:.1f} s")
    manifests = tmp / "manifests"
    manifests.mkdir()
    (manifests / "catalogue.yaml").write_text(yaml.safe_dump({"providers": catalogue_entries(tmp, names)}))
    figures: dict[int, list[float]] = {parallel: [] for parallel in PARALLEL}
    for _ in range(ROUNDS):  # interleaved: a slower stretch of the shared machine hits each alike
        for parallel in PARALLEL:
            elapsed, read = read_once(tmp, manifests, parallel)
            assert read == STACKS, f"read {read} of {STACKS} stacks"
            figures[parallel].append(elapsed)
    serial = statistics.median(figures[1])
    for parallel, samples in figures.items():
        median = statistics.median(samples)
        print(
            f"backend read of {STACKS} stacks, max_parallel {parallel}: median {median:.2f} s "
            f"(min {min(samples):.2f}, max {max(samples):.2f}; {ROUNDS} rounds), "
            f"{median / STACKS * 1000:.0f} ms a stack; ratio to serial {median / serial:.2f}"
        )


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-backend-read-") as tmp:
        run(Path(tmp))


if __name__ == "__main__":
    main()
