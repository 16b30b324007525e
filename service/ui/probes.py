"""Each proxy's last probes, for the small chart on its page, fed by the health engine's `on_probe`.

The fleet's history is one array: SIZE latencies per proxy in whole milliseconds (uint16; FAILED marks a
failed probe, a probe slower than SLOWEST ms counts as SLOWEST), at a slot of its own, and a count of the
probes each slot has recorded: 117 bytes a proxy with its dictionary entry, measured with tracemalloc
at 10,000 (an array of floats per proxy and two dictionary entries were 242). The chart shows whole
milliseconds, so nothing it shows is lost. A proxy the inventory no longer holds is forgotten (the health
engine's `on_gone`; before, a removed proxy's history was kept for good), and its slot serves the next.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from service.inventory import Health
from service.ui.html import esc

SIZE = 30  # probes kept per proxy
FAILED = 0xFFFF  # a failed probe
SLOWEST = 0xFFFE  # milliseconds: a slower probe is kept as this


@dataclass
class ProbeHistory:
    _slots: dict[str, int] = field(default_factory=dict)  # key -> its slot
    _free: list[int] = field(default_factory=list)  # slots of forgotten proxies
    _latency_ms: array[int] = field(default_factory=lambda: array("H"))  # SIZE per slot, a ring each
    _count: array[int] = field(default_factory=lambda: array("Q"))  # probes recorded per slot

    def record(self, key: str, health: Health) -> None:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._new_slot(key)
        n = self._count[slot]
        failed = health.consecutive_failures > 0 or health.last_latency_seconds is None
        latency = FAILED if failed else min(round((health.last_latency_seconds or 0.0) * 1000), SLOWEST)
        self._latency_ms[slot * SIZE + n % SIZE] = latency
        self._count[slot] = n + 1

    def series(self, key: str) -> list[float | None]:
        """Seconds, oldest first; None for a failed probe."""
        slot = self._slots.get(key)
        if slot is None:
            return []
        n, base, ring = self._count[slot], slot * SIZE, self._latency_ms
        values = (ring[base + i % SIZE] for i in range(n - min(n, SIZE), n))
        return [None if value == FAILED else value / 1000 for value in values]

    def forget(self, key: str) -> None:
        slot = self._slots.pop(key, None)
        if slot is not None:
            self._free.append(slot)

    def __len__(self) -> int:
        return len(self._slots)

    def _new_slot(self, key: str) -> int:
        if self._free:
            slot = self._free.pop()
            self._count[slot] = 0  # the ring's old values are never read: the count says how many are new
        else:
            slot = len(self._count)
            self._count.append(0)
            self._latency_ms.frombytes(bytes(2 * SIZE))
        self._slots[key] = slot
        return slot


def chart(series: list[float | None]) -> str:
    """Bars of latency (failed probes full height, in the alert colour), server-rendered SVG."""
    if not series:
        return '<p class="mute">no probe seen by this replica yet</p>'
    slowest = max([s for s in series if s is not None], default=0.0)
    top = slowest or 0.001  # the bars' scale: every probe may have taken under a millisecond (0)
    width, height, bar = 8 * SIZE, 60, 6
    bars = []
    for i, value in enumerate(series):
        tall = height if value is None else max(2.0, height * value / top)
        tone = "var(--bad)" if value is None else "var(--ok)"
        label = "failed" if value is None else f"{value * 1000:.0f} ms"
        bars.append(
            f'<rect x="{i * 8}" y="{height - tall:.1f}" width="{bar}" height="{tall:.1f}" fill="{tone}">'
            f"<title>{esc(label)}</title></rect>"
        )
    failed = sum(1 for s in series if s is None)
    summary = f"last {len(series)} probes: {failed} failed, slowest {slowest * 1000:.0f} ms"
    return (
        f'<svg class="chart" role="img" aria-label="{esc(summary)}" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}">{"".join(bars)}</svg><p class="mute">{esc(summary)}</p>'
    )
