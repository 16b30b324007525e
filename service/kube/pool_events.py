"""Warning Events (core/v1) on a ProxyPool: what the pool will not do and why (a placement naming an unknown
provider, a Proxy carrying its label that it does not own).

The same (pool, reason, message) is posted once per `window` (per term: a new leader says it again), so a
pass every few seconds does not flood the API. Best effort, as the Proxies' events (service/kube/events.py):
a failed call is logged and not retried; the pool's status and the log line say it anyway.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes.client import ApiClient
from urllib3.exceptions import HTTPError as Urllib3Error

from service.kube.client import ApiException, request_json
from service.kube.events import COMPONENT, MAX_MESSAGE, REPORTING_CONTROLLER
from stacks.models import API_VERSION, POOL_KIND

log = logging.getLogger(__name__)

Obj = dict[str, Any]


class PoolEvents:
    def __init__(
        self, api: ApiClient, *, window: float = 600.0, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.api, self.window, self.monotonic = api, window, monotonic
        self._sent: dict[tuple[str, str, str], float] = {}
        self.posted = 0

    def warn(self, pool: Obj, reason: str, message: str) -> None:
        meta = pool.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        key, now = (uid, reason, message), self.monotonic()
        sent = self._sent.get(key)
        if sent is not None and now - sent < self.window:
            return
        self._sent[key] = now
        namespace, name = meta.get("namespace") or "default", meta.get("name") or ""
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": POOL_KIND,
                "namespace": namespace,
                "name": name,
                "uid": uid,
            },
            "type": "Warning",
            "reason": reason,
            "message": message[:MAX_MESSAGE],
            "source": {"component": COMPONENT},
            "reportingComponent": REPORTING_CONTROLLER,
            "reportingInstance": "",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            request_json(
                self.api, "POST", f"/api/v1/namespaces/{namespace}/events", body=body, timeout=(5, 30)
            )
        except (ApiException, Urllib3Error, OSError, ValueError) as exc:
            log.warning("cannot post the event %s of ProxyPool %s/%s (%s)", reason, namespace, name, exc)
            return
        self.posted += 1
