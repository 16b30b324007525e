"""How tests start pproxy (the HTTP CONNECT and SOCKS5 proxy they lease through and probe).

pproxy's `main` calls `uvloop.install()` whenever uvloop can be imported, then `asyncio.get_event_loop()`
with no loop running, which uvloop 0.23's policy refuses: pproxy 2.7.9 exits at start. uvloop is a
dependency of the service (its API's event loop, service/api_server.py), so pproxy runs with uvloop
hidden, on asyncio's own loop as before.
"""

from __future__ import annotations

import sys

PPROXY = [
    sys.executable,
    "-c",
    "import sys; sys.modules['uvloop'] = None; from pproxy.server import main; main()",
]
