"""Orphans: resources that carry our marks and this installation's id but that no stack's state holds.

One small query per provider type lists what carries the marks (`stacks/marks.py`); the comparison with
the stacks' state is pure. Per type: `local` (processes under our state folders), `kubernetes` (labelled
objects in the entry's namespace), `gcp` (labelled instances, described firewall rules), `kvm` (domains
described as ours). See docs/pools.md, "Orphans".
"""

from automation.orphans.local import (
    forward_proxy_processes,
    known_instance_ids,
    local_orphans,
    stop_local,
)
from automation.orphans.model import LocalProcess, Orphan, state_ids

__all__ = [
    "LocalProcess",
    "Orphan",
    "forward_proxy_processes",
    "known_instance_ids",
    "local_orphans",
    "state_ids",
    "stop_local",
]
