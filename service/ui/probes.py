"""Each proxy's last probes, for the small chart on its page: 30 latencies in a float array per proxy
(a failed probe is -1), about 200 bytes a proxy; fed by the health engine's `on_probe`."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from service.inventory import Health
from service.ui.html import esc

SIZE = 30


@dataclass
class ProbeHistory:
    _latency: dict[str, array[float]] = field(default_factory=dict)
    _next: dict[str, int] = field(default_factory=dict)  # where the next probe is written; counts past SIZE

    def record(self, key: str, health: Health) -> None:
        ring = self._latency.get(key)
        if ring is None:
            ring = self._latency[key] = array("f", [0.0] * SIZE)
        n = self._next.get(key, 0)
        failed = health.consecutive_failures > 0 or health.last_latency_seconds is None
        ring[n % SIZE] = -1.0 if failed else float(health.last_latency_seconds or 0.0)
        self._next[key] = n + 1

    def series(self, key: str) -> list[float | None]:
        """Oldest first; None for a failed probe."""
        ring, n = self._latency.get(key), self._next.get(key, 0)
        if ring is None:
            return []
        order = range(n - min(n, SIZE), n)
        return [None if ring[i % SIZE] < 0 else float(ring[i % SIZE]) for i in order]

    def forget(self, key: str) -> None:
        self._latency.pop(key, None)
        self._next.pop(key, None)


def chart(series: list[float | None]) -> str:
    """Bars of latency (failed probes full height, in the alert colour), server-rendered SVG."""
    if not series:
        return '<p class="mute">no probe seen by this replica yet</p>'
    top = max([s for s in series if s is not None] or [0.001])
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
    summary = f"last {len(series)} probes: {failed} failed, slowest {top * 1000:.0f} ms"
    return (
        f'<svg class="chart" role="img" aria-label="{esc(summary)}" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}">{"".join(bars)}</svg><p class="mute">{esc(summary)}</p>'
    )
