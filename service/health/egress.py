"""Proxies that leave through one egress IP: to a target site they are one proxy."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from service.inventory import Health


def shared_egress(health: Mapping[str, Health]) -> dict[str, list[str]]:
    """egress IP -> sorted keys, for every IP that more than one proxy uses."""
    by_ip: dict[str, list[str]] = defaultdict(list)
    for key, h in health.items():
        if h.egress_ip:
            by_ip[h.egress_ip].append(key)
    return {ip: sorted(keys) for ip, keys in sorted(by_ip.items()) if len(keys) > 1}
