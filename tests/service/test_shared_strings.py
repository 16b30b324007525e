"""Equal strings that 10,000 Proxies repeat are held once (issue 20: a census at 10,000 running proxies,
tests/bench/census.py, found 5.4 MiB of equal strings held as separate objects): the endpoint's name, its
credentials, a shared listener's instance id and control socket, the credentials Secret's parsed copy
and the watched copy's name. The probe's egress address: tests/service/test_health_probe.py."""

from __future__ import annotations

import base64
import json
from typing import Any

from service.kube.credentials import parse
from service.kube.proxy_object import proxy_object
from service.reporter import endpoint_of
from stacks.models import Proxy


def _decoded(value: Any) -> Any:
    return json.loads(json.dumps(value))  # each read of the cluster or an output is a fresh object


def _proxy(name: str) -> Proxy:
    return Proxy.model_validate(
        _decoded(
            {
                "apiVersion": "crawl.example.com/v1alpha1",
                "kind": "Proxy",
                "metadata": {"name": name, "namespace": "crawl"},
                "spec": {"provider": "local", "port": 3128},
            }
        )
    )


def _out(port: int) -> dict[str, object]:
    out = {"host": "127.0.0.1", "port": port, "protocol": "http", "instanceId": "4242-99"}
    return _decoded({**out, "control": "/state/_shared-local.ctl"})


def test_an_endpoint_shares_what_repeats_and_what_other_copies_hold() -> None:
    creds = _decoded({"username": "user-a1", "password": "secret-a1-long"})
    a = endpoint_of(_proxy("a1"), stack="local", out=_out(1), creds=creds)
    b = endpoint_of(_proxy("b1"), stack="local", out=_out(2), creds={})
    assert a.instance_id is b.instance_id
    assert a.control is b.control
    again = endpoint_of(_proxy("a1"), stack="local", out=_out(1), creds=_decoded(dict(creds)))
    assert again.name is a.name
    assert again.username is a.username
    assert again.password is a.password
    meta = {"name": "a1", "namespace": "crawl", "uid": "u"}
    watched = proxy_object(_decoded({"metadata": meta, "spec": {}}))
    assert watched.name is a.name
    fields = {"host": "127.0.0.1", "port": "1", "username": "user-a1", "password": "secret-a1-long"}
    secret = {k: base64.b64encode(v.encode()).decode() for k, v in fields.items()}
    parsed = parse(secret)
    assert parsed is not None
    assert parsed.username is a.username
    assert parsed.password is a.password
