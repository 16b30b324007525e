"""An echo server on 127.0.0.1 that counts what each connection received and sees when it was closed.

What a tunnel through the proxy reaches: the tests read, per connection, how many bytes arrived (so nothing
arrives after a cut) and whether the proxy closed its side (the upstream half of a cut).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Line:
    """One connection the echo server accepted."""

    received: int = 0
    closed_at: float | None = None  # monotonic time the peer closed (EOF or reset)


@dataclass
class Echo:
    port: int
    lines: list[Line] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def line(self, index: int, *, within: float = 5.0) -> Line:
        """The `index`-th accepted connection, waiting for it to arrive."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.lines) > index:
                    return self.lines[index]
            time.sleep(0.01)
        raise AssertionError(f"the echo server never saw connection {index}")

    def _accepted(self) -> Line:
        with self._lock:
            self.lines.append(Line())
            return self.lines[-1]


def _echo(conn: socket.socket, line: Line) -> None:
    with conn:
        try:
            while data := conn.recv(65536):
                line.received += len(data)
                conn.sendall(data)
        except OSError:
            pass
        line.closed_at = time.monotonic()


@contextmanager
def serve_echo() -> Iterator[Echo]:
    """Echo every byte back; yields the server (its port, its connections); stopped on leaving."""
    listener = socket.create_server(("127.0.0.1", 0))
    echo = Echo(port=listener.getsockname()[1])
    conns: list[tuple[socket.socket, threading.Thread]] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # the listener was closed
            worker = threading.Thread(target=_echo, args=(conn, echo._accepted()), name="echo", daemon=True)
            conns.append((conn, worker))
            worker.start()

    acceptor = threading.Thread(target=accept, name="echo-accept", daemon=True)
    acceptor.start()
    try:
        yield echo
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        acceptor.join()
        for conn, worker in conns:
            with contextlib.suppress(OSError):  # already closed by its worker
                conn.shutdown(socket.SHUT_RDWR)
            worker.join(timeout=5)
