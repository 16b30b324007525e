"""A loopback TCP relay between the replicas and kube-apiserver that the campaign can cut.

The replicas' kubeconfig names the relay's port; TLS passes through untouched (the apiserver's certificate
is for 127.0.0.1, whatever the port). `cut()` closes every open connection at once, both sides: each
replica's watches and requests see the stream drop and must reconnect (new connections are accepted as
before).

The same class stands in for the operator's ClusterIP Service: `Relay(pick)` with a function that names the
port of the replica to reach for each new connection (deploy/deployment.yaml sets the health probe URL to
the Service, one address whatever replica leads; see `campaign.service_target`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import yaml


class Relay:
    def __init__(self, target_port: int | Callable[[], int | None], host: str = "127.0.0.1") -> None:
        self.host, self.target_port = host, target_port
        self.server = socket.create_server((host, 0))
        self.port = self.server.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        self.cuts = 0
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            port = self.target_port() if callable(self.target_port) else self.target_port
            if port is None:  # nobody to reach (a Service without endpoints)
                client.close()
                continue
            try:
                upstream = socket.create_connection((self.host, port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, upstream}
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._close(src, dst)

    def _close(self, *sockets: socket.socket) -> None:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
            with self._lock:
                self._open.discard(sock)

    def cut(self) -> int:
        """Close every connection now; how many sockets were open."""
        with self._lock:
            sockets = list(self._open)
        self._close(*sockets)
        self.cuts += 1
        return len(sockets)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.server.close()
        self.cut()

    def kubeconfig(self, original: Path, into: Path) -> Path:
        """A copy of `original` whose server is this relay."""
        document = yaml.safe_load(original.read_text())
        for cluster in document["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        into.write_text(yaml.safe_dump(document, sort_keys=False))
        into.chmod(0o600)
        return into
