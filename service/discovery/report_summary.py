"""Who reported what on each proxy: per (target, client, kind) a count and the time of the latest report.

Kept in the discovery store beside the penalties, so with Redis every replica's page shows the same. Bounded
twice: at most `MOST` entries per proxy (a new one drops the entry whose latest report is oldest), and an
entry with no report for `KEEP_SECONDS` is gone (Redis: the keys' TTL follows the latest report, and a read
skips older entries). `count` counts the entry's reports since it was first kept. Written by the call that
takes a report (service/discovery/reports.py) once the report is accepted, so a refused one (403, 409, 429)
counts nowhere. It holds no lease id and no credential: a target, a client name, a kind.

Memory (measured by tests/service/test_report_summary_memory.py; host names like www.shop-1.example.com,
client names like crawler-0): per proxy, 4 entries (a few crawlers on a few sites) take 620 B in Redis (its
`MEMORY USAGE` of `P:rep:<proxy>` and `P:repat:<proxy>`, small listpacks) and 1.4 KB in the memory store;
the 32 it keeps at most, 3.8 KB and 9.5 KB. At 10,000 proxies: 6 MB in Redis and 14 MB in memory with 4
entries each; 38 MB and 95 MB in the worst case, every proxy at 32 entries within one day.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MOST = 32
KEEP_SECONDS = 24 * 3600.0


@dataclass(frozen=True)
class ReportEntry:
    target: str
    client: str
    kind: str  # banned, ok, error: the report's outcome
    count: int
    last: float  # store-clock seconds of the latest


def field_of(*, target: str, client: str, kind: str) -> str:
    """The entry's name in Redis (an opaque string to the script)."""
    return json.dumps([target, client, kind], separators=(",", ":"))


def entry_of(name: str, *, count: int, last: float) -> ReportEntry:
    target, client, kind = json.loads(name)
    return ReportEntry(target=target, client=client, kind=kind, count=count, last=last)


def newest_first(entries: list[ReportEntry]) -> list[ReportEntry]:
    return sorted(entries, key=lambda e: (-e.last, e.target, e.client, e.kind))


class ReportSummaries:
    """The memory store's copy; not locked (the memory store calls it under its own lock)."""

    def __init__(self) -> None:
        self._by_proxy: dict[str, dict[tuple[str, str, str], tuple[int, float]]] = {}

    def note(self, *, proxy: str, target: str, client: str, kind: str, now: float) -> None:
        entries = self._live(proxy, now=now)
        count, _ = entries.get((target, client, kind), (0, now))
        entries[(target, client, kind)] = (count + 1, now)
        while len(entries) > MOST:
            del entries[min(entries, key=lambda k: entries[k][1])]
        self._by_proxy[proxy] = entries

    def read(self, proxy: str, *, now: float) -> list[ReportEntry]:
        found = self._live(proxy, now=now)
        return newest_first(
            [
                ReportEntry(target=t, client=c, kind=k, count=n, last=at)
                for (t, c, k), (n, at) in found.items()
            ]
        )

    def sweep(self, *, now: float) -> None:
        for proxy in list(self._by_proxy):
            if not self._live(proxy, now=now):
                del self._by_proxy[proxy]

    def _live(self, proxy: str, *, now: float) -> dict[tuple[str, str, str], tuple[int, float]]:
        entries = self._by_proxy.get(proxy, {})
        old = [k for k, (_, at) in entries.items() if at <= now - KEEP_SECONDS]
        for key in old:
            del entries[key]
        return entries


# KEYS: counts hash (entry -> reports), latest zset (entry -> when its latest came); ARGV: entry, now,
# keep seconds, most entries. Drops what is older than `keep`, counts this report, then drops the oldest
# entries past `most`; both keys live `keep` seconds after the latest report.
NOTE_REPORT = r"""
local now, keep, most = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cut = string.format('%.6f', now - keep)
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', cut)
for i = 1, #old do redis.call('HDEL', KEYS[1], old[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', cut)
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('ZADD', KEYS[2], string.format('%.6f', now), ARGV[1])
local over = redis.call('ZCARD', KEYS[2]) - most
if over > 0 then
  local gone = redis.call('ZRANGE', KEYS[2], 0, over - 1)
  for i = 1, #gone do redis.call('HDEL', KEYS[1], gone[i]) end
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, over - 1)
end
local ms = math.floor(keep * 1000)
redis.call('PEXPIRE', KEYS[1], ms)
redis.call('PEXPIRE', KEYS[2], ms)
return 1
"""
