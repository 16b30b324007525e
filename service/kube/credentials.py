"""Each Proxy's credentials in a Secret it owns: written by the leader, read by every replica.

Credentials do not belong in status (anyone who may read Proxies would read them). The leader writes one
Secret per Proxy, `<name>-proxy-credentials` in the Proxy's namespace, owned by the Proxy (the garbage
collector deletes it with the Proxy), with server-side apply as field manager `proxy-operator`, and only when
what it holds changed. Every replica lists and watches those Secrets (label and type selectors, one watch per
namespace: Roles per namespace, not cluster-wide Secret access) and answers `credentials(key)`.
"""

from __future__ import annotations

import base64
import binascii
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kubernetes.client import ApiClient

from service.inventory import interned
from service.kube.client import request_json
from service.kube.refs import ProxyRef
from service.kube.watch import Obj, Watcher
from stacks.forward_proxy.channel import TCP_SCHEME

__all__ = [
    "LABELS",
    "SECRET_TYPE",
    "Credentials",
    "CredentialsReader",
    "CredentialsWriter",
    "followed_output",
    "secret_name",
    "shared_control",
]

MANAGED_BY = "app.kubernetes.io/managed-by"
PROXY_LABEL = "crawl.example.com/proxy"
LABELS = {MANAGED_BY: "proxy-operator"}
SECRET_TYPE = "crawl.example.com/proxy-credentials"  # a field selector keeps other managed Secrets out
FIELD_MANAGER = "proxy-operator"
SUFFIX = "-proxy-credentials"
MAX_NAME = 253  # a Secret's name is a DNS-1123 subdomain


@dataclass(frozen=True, slots=True)
class Credentials:
    host: str
    port: int
    protocol: str
    username: str | None = None  # None: auth.mode none
    password: str | None = None
    control: str | None = None  # a `tcp://` lease-user channel every replica reaches (a proxy pod's)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def shared_control(control: str | None) -> str | None:
    """The channel when other replicas can reach it too (`tcp://`); a unix socket is the leader's own."""
    return control if control is not None and control.startswith(TCP_SCHEME) else None


def followed_output(address: dict[str, Any], creds: dict[str, Any]) -> dict[str, Any]:
    """What a follower takes for a proxy's stack output: the leader's status address, the protocol and a
    proxy pod's control channel from the Secret (so followers push lease users too)."""
    out = {**address, "protocol": creds.get("protocol")}
    if creds.get("control"):
        out["control"] = creds["control"]
    return out


def secret_name(proxy_name: str) -> str:
    """`<name>-proxy-credentials`, capped to 253 characters, ending in an alphanumeric character."""
    return (proxy_name + SUFFIX)[:MAX_NAME].rstrip("-.")


class CredentialsWriter:
    """Writes a Proxy's Secret when its credentials changed since this writer last wrote them."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api
        self.writes = 0
        self._written: dict[str, Credentials] = {}  # uid -> credentials applied
        self._lock = threading.Lock()
        # What the reader holds for a key (service/incluster.py wires `CredentialsReader.held`): an equal
        # object is kept instead of a second one (about 110 bytes a proxy; `shared` is the other way).
        self.known: Callable[[str], Credentials | None] = lambda key: None

    def write(self, ref: ProxyRef, credentials: Credentials) -> bool:
        """Apply the Secret unless it already holds these credentials; True when it was written."""
        with self._lock:
            written = self._written.get(ref.uid)
        if written == credentials:
            if written is not self.known(ref.key) and written is not None:
                self._keep(ref, written)  # the reader's copy once it has one
            return False
        request_json(
            self.api,
            "PATCH",
            f"/api/v1/namespaces/{ref.namespace}/secrets/{secret_name(ref.name)}",
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            body=secret_body(ref, credentials),
            content_type="application/apply-patch+yaml",  # JSON is YAML
        )
        self._keep(ref, credentials)
        with self._lock:
            self.writes += 1
        return True

    def _keep(self, ref: ProxyRef, credentials: Credentials) -> None:
        held = self.known(ref.key)
        with self._lock:
            self._written[ref.uid] = held if held == credentials else credentials

    def shared(self, uid: str | None, credentials: Credentials) -> Credentials:
        """`credentials` (read from the Secret of the Proxy `uid`), or this writer's equal copy: the reader
        keeps that one, not a second."""
        with self._lock:
            written = self._written.get(uid) if uid is not None else None
        return written if written is not None and written == credentials else credentials

    def forget(self, uid: str) -> None:
        """The Proxy's Secret is gone (with the Proxy, or deleted by someone: the next publish writes it
        again): stop remembering it. The reader's `on_deleted` calls it; without it, what was written for
        every Proxy ever deleted was kept for good."""
        with self._lock:
            self._written.pop(uid, None)


def secret_body(ref: ProxyRef, credentials: Credentials) -> Obj:
    fields = {k: str(v) for k, v in credentials.as_dict().items() if v is not None}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": SECRET_TYPE,
        "metadata": {
            "name": secret_name(ref.name),
            "namespace": ref.namespace,
            "labels": {**LABELS, PROXY_LABEL: ref.name},
            "ownerReferences": [ref.owner_reference()],
        },
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in fields.items()},
    }


class CredentialsReader:
    """Every replica's view of the credentials Secrets of the watched namespaces (empty: all namespaces)."""

    def __init__(self, api: ApiClient, namespaces: list[str], *, timeout_seconds: int = 300) -> None:
        scopes = namespaces or [""]
        self._known: dict[str, dict[str, Credentials]] = {scope: {} for scope in scopes}
        self._lock = threading.Lock()
        # The Proxy (its key) whose credentials changed or went: called after they did (watch threads).
        self.on_change: Callable[[str], None] = lambda key: None
        # The uid of the Proxy whose Secret was deleted (by the garbage collector with its Proxy, or by
        # someone): the leader's writer forgets what it wrote for it (watch threads).
        self.on_deleted: Callable[[str], None] = lambda uid: None
        # (owner uid, credentials read) -> the object to keep: the leader's writer gives its equal copy.
        self.shared: Callable[[str | None, Credentials], Credentials] = lambda uid, credentials: credentials
        self.watchers = [
            Watcher(
                api,
                f"/api/v1/namespaces/{scope}/secrets" if scope else "/api/v1/secrets",
                on_list=lambda items, scope=scope: self._listed(scope, items),  # type: ignore[misc]
                on_event=lambda kind, obj, scope=scope: self._event(scope, kind, obj),  # type: ignore[misc]
                slim=slim_secret,
                label_selector=f"{MANAGED_BY}={LABELS[MANAGED_BY]},{PROXY_LABEL}",
                field_selector=f"type={SECRET_TYPE}",
                timeout_seconds=timeout_seconds,
                name=f"credentials {scope or '*'}",
            )
            for scope in scopes
        ]

    def start(self) -> None:
        for watcher in self.watchers:
            watcher.start()

    def stop(self) -> None:
        for watcher in self.watchers:
            watcher.stop()

    def synced(self, timeout: float) -> bool:
        return all(watcher.synced.wait(timeout) for watcher in self.watchers)

    def credentials(self, key: str) -> dict[str, Any] | None:
        """{username, password, host, port, protocol} of the Proxy `namespace/name`, or None."""
        namespace = key.partition("/")[0]
        with self._lock:
            found = (self._known.get(namespace) or self._known.get("") or {}).get(key)
        return found.as_dict() if found is not None else None

    def held(self, key: str) -> Credentials | None:
        """The credentials object kept for `key` (not a copy: the writer keeps the same one)."""
        namespace = key.partition("/")[0]
        with self._lock:
            return (self._known.get(namespace) or self._known.get("") or {}).get(key)

    def _listed(self, scope: str, items: list[Obj]) -> None:
        fresh = {
            item["key"]: self.shared(item.get("owner"), item["credentials"])
            for item in items
            if item.get("credentials")
        }
        with self._lock:
            known, self._known[scope] = self._known[scope], fresh
        for key in set(known) | set(fresh):
            if known.get(key) != fresh.get(key):
                self.on_change(key)

    def _event(self, scope: str, kind: str, obj: Obj) -> None:
        gone = kind == "DELETED" or not obj.get("credentials")
        credentials = (
            None if gone else self.shared(obj.get("owner"), obj["credentials"])
        )  # not under the lock
        with self._lock:
            known = self._known[scope]
            if credentials is None:
                known.pop(obj["key"], None)
            else:
                known[obj["key"]] = credentials
        if kind == "DELETED" and obj.get("owner"):
            self.on_deleted(obj["owner"])
        self.on_change(obj["key"])


def slim_secret(obj: Obj) -> Obj:
    """Only the proxy's key, its parsed credentials (None when the Secret is not readable) and the uid of
    the Proxy that owns it (None without one) are kept; the reader keeps the credentials alone."""
    meta = obj.get("metadata") or {}
    key = f"{meta.get('namespace')}/{(meta.get('labels') or {}).get(PROXY_LABEL)}"
    owner = next(
        (
            ref.get("uid")
            for ref in meta.get("ownerReferences") or []
            if isinstance(ref, dict) and ref.get("kind") == "Proxy"
        ),
        None,
    )
    return {"key": sys.intern(key), "credentials": parse(obj.get("data") or {}), "owner": owner}


def parse(data: dict[str, str]) -> Credentials | None:
    try:
        fields = {k: base64.b64decode(v).decode() for k, v in data.items()}
        return Credentials(  # hosts and protocols repeat over the fleet: kept once
            host=sys.intern(fields["host"]),
            port=int(fields["port"]),
            protocol=sys.intern(fields.get("protocol") or "http"),
            username=interned(fields.get("username")),  # the inventory's endpoint holds the same
            password=interned(fields.get("password")),
            control=shared_control(fields.get("control")),
        )
    except (KeyError, ValueError, binascii.Error, UnicodeDecodeError):
        return None
