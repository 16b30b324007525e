"""No credentials to a listener the stack did not make: the check before every probe of a `local` proxy.

A `local` proxy is a process on this machine. Once it is gone (a crash, a kill, a reboot) any local user
may bind its port, and a probe would hand that listener the proxy's credentials (the Proxy-Authorization
header, the SOCKS5 username and password), a lease would send crawlers there. The stack's outputs say which
process serves the endpoint (its instance id, pid and start time), and the service runs on the same machine,
so before each probe it checks in /proc that this process still runs our forward proxy and holds the
listening socket on the endpoint's port itself (`stacks/forward_proxy/identity.py`: then nobody else holds
it). Otherwise nothing is sent: the probe fails as `unverified`, the endpoint turns unhealthy at once (it is
not handed out), and the health sink asks for its stack's drift check, whose refresh finds the process gone:
`driftPolicy: correct` starts it again with `up`, `detect` reports it.

Endpoints of other providers are not checked here (their processes are not on this machine).
"""

from __future__ import annotations

from service.inventory import ProxyEndpoint
from stacks.forward_proxy.identity import ProcessRef, listener_refusal

UNVERIFIED = "unverified"  # the probe outcome (metrics) of an endpoint this refuses


def refusal(endpoint: ProxyEndpoint) -> str | None:
    """Why `endpoint` must not be probed (the Healthy condition's message); None when it may be."""
    if not endpoint.local:
        return None
    where = f"{endpoint.host}:{endpoint.port}"
    ref = ProcessRef.from_instance_id(endpoint.instance_id)
    if ref is None or endpoint.port is None:
        return f"not probed: the stack recorded no process for the local proxy at {where}"
    why = listener_refusal(ref, port=endpoint.port)
    if why is None:
        return None
    return f"not probed: {where} is not held by the proxy its stack started: {why}"
