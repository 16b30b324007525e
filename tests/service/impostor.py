"""A stand-in for a local user who binds a `local` proxy's port once its process is gone: a plain listener on
loopback that records every byte it receives and answers like a working proxy (HTTP, or SOCKS5 with
username/password), so a probe that reached it would pass and its proxy would be handed out."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import TracebackType

ECHO = b'{"ip": "127.0.0.1"}'
HTTP_OK = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
)


class Impostor:
    def __init__(self, port: int, *, protocol: str = "http") -> None:
        self.port = port
        self.protocol = protocol
        self.connections = 0
        self._received: list[bytes] = []
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as an attacker would
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"impostor:{port}", daemon=True)
        self._thread.start()

    @property
    def received(self) -> bytes:
        with self._lock:
            return b"".join(self._received)

    def saw(self, data: bytes, *, within: float = 10.0) -> bool:
        """Whether `data` arrives within `within` seconds (its thread reads what a probe sent a little
        after the probe returns, later still on a loaded machine)."""
        deadline = time.monotonic() + within
        while data not in self.received:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def __enter__(self) -> Impostor:
        return self

    def __exit__(
        self, _type: type[BaseException] | None, _exc: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
            with conn, contextlib.suppress(OSError):
                conn.settimeout(2)
                self._answer(conn)

    def _recv(self, conn: socket.socket) -> bytes:
        data = conn.recv(4096)
        with self._lock:
            self._received.append(data)
        return data

    def _answer(self, conn: socket.socket) -> None:
        if self.protocol == "socks5":
            self._recv(conn)  # greeting
            conn.sendall(b"\x05\x02")  # choose username/password: the client sends both next
            self._recv(conn)
            conn.sendall(b"\x01\x00")
            self._recv(conn)  # CONNECT
            conn.sendall(b"\x05\x00\x00\x01" + socket.inet_aton("127.0.0.1") + b"\x00\x50")
        head = b""
        while b"\r\n\r\n" not in head and (chunk := self._recv(conn)):
            head += chunk
        conn.sendall(HTTP_OK % len(ECHO) + ECHO)
