"""A small real website on 127.0.0.1 for the client tests: each path misbehaves on its first hit, then serves.

`/ok` always 200; `/ban403` and `/ban429` answer 403 / 429 first; `/drop` closes the connection without an
answer first; `/slow` answers only after `slow_seconds` first (past a client's download timeout). Every
later hit of a path is a 200. `hits` counts requests per path. `on_first_hit[path]` runs while that first
request waits for its answer (a test uses it to act "in the middle" of a fetch).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAGE = b"<html>ok</html>"
FIRST_STATUS = {"/ban403": 403, "/ban429": 429}


class Site:
    def __init__(
        self, *, slow_seconds: float = 3.0, on_first_hit: dict[str, Callable[[], None]] | None = None
    ) -> None:
        self.hits: Counter[str] = Counter()
        self.slow_seconds = slow_seconds
        self.on_first_hit = on_first_hit or {}
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, name="site")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    def first_hit(self, path: str) -> bool:
        with self._lock:
            self.hits[path] += 1
            return self.hits[path] == 1

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0].removeprefix(site.base)  # proxies send absolute URIs
                first = site.first_hit(path)
                if first and path in site.on_first_hit:
                    site.on_first_hit[path]()
                if first and path == "/drop":
                    self.close_connection = True  # no status line at all: a download error
                    return
                if first and path == "/slow":
                    time.sleep(site.slow_seconds)
                status = FIRST_STATUS.get(path, 200) if first else 200
                body = PAGE if status == 200 else b"blocked"
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (the slow path's first hit): what it is for

            def log_message(self, *args: object) -> None:
                return

        return Handler

    def __enter__(self) -> Site:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
