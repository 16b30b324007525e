"""A `local` stack's drift check, answered from /proc when every recorded process checks out (issue 20).

A refresh of a `local` stack learns one fact per proxy: whether the process its state recorded still runs
(`stacks/programs/local.py`'s `read`; a shared listener's proxy also asks the listener whether it still
serves that port, `local_shared.py`). Everything else in such a stack (the proxy components, the generated
credentials) reads back what the state holds. The probe gate asks the same question from /proc before every
probe (`stacks.forward_proxy.identity.listener_refusal`): the recorded process (pid and start time) runs our
forward proxy and itself holds the listening socket on the proxy's port.

At 10,000 proxies over 20 stacks a resync's `preview --refresh` of every stack took about 190 CPU-seconds
(9.5 a stack of 500: the engine and the dynamic provider walk 1,501 resources), half of the two cores for six
minutes of every ten, and the lease rate fell from 471/s to 224-343/s while it ran. This check reads /proc
once per proxy instead, in a worker thread. When every proxy of the stack passes, the drift check is
answered: nothing differs that a refresh would find. When one does not, the check says which and why, and
the reconciler runs the refresh as before, which is what reports the drift or puts the resources back.

It answers a resync's check, the check of a cold start (a restarted service whose proxies still run) and
the check after a change's `up` (of the processes that `up` recorded), never the repair of a proxy that
fails its probes: there the process may run and hold its port and still
be wrong (a listener that no longer answers its control socket), and the refresh asks it.

What it does not see, where a refresh would: a shared listener serving a proxy's port with another bind
address or protocol than the state records. Only a call on the listener's control socket by hand can do
that (our own edits of those replace the proxy, and a replacement the engine did not finish leaves pending
operations that the next `up` handles).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from automation.engine.config import APPLIED_PROXIES_OUTPUT
from stacks.forward_proxy.identity import ProcessRef, listener_refusal

PROXIES_OUTPUT = "proxies"  # {"ns/name": {"host", "port", "protocol", "instanceId", "control"}}


def unverified(outputs: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first proxy the stack's outputs say it runs whose recorded process does not check out, and why;
    None when every one does. A proxy planned but not applied yet has no process to check (its `up` starts
    it). Reads /proc: call it off the event loop."""
    return first_unverified(applied_keys(outputs), outputs.get(PROXIES_OUTPUT))


def applied_keys(outputs: Mapping[str, Any]) -> list[str] | None:
    """What the check needs of the applied proxies (most of a stack's outputs): their keys, in order ("-"
    for an entry that is not a proxy); None when the outputs record none."""
    applied = outputs.get(APPLIED_PROXIES_OUTPUT)
    if not isinstance(applied, list):
        return None
    return [
        f"{item.get('namespace')}/{item.get('name')}" if isinstance(item, Mapping) else "-"
        for item in applied
    ]


def first_unverified(keys: list[str] | None, published: object) -> tuple[str, str] | None:
    """`unverified` of the applied proxies' keys (`applied_keys`) and the stack's `proxies` output."""
    if keys is None or not isinstance(published, Mapping):
        return "-", "the stack's outputs record no proxies"
    for key in keys:
        out = published.get(key)
        if not isinstance(out, Mapping):
            return key, "the stack's outputs do not record where it serves"
        ref = ProcessRef.from_instance_id(str(out.get("instanceId") or ""))
        try:
            port = int(out["port"])
        except (KeyError, TypeError, ValueError):
            ref = None
        if ref is None:
            return key, "the stack's outputs record no process for it"
        why = listener_refusal(ref, port=port)
        if why is not None:
            return key, why
    return None
