"""A proxy pod's `tcp://` control channel on its way to every replica's inventory: the leader's endpoint
from the stack output (a pod is not a local process, whatever `control` holds), the credentials Secret that
followers read (which carries a `tcp://` channel, never the leader's own unix socket), and the follower's
endpoint from it. Each test fails on the code before, where only local endpoints had `control` (and the key
alone made an endpoint local) and followers had no channel at all."""

from __future__ import annotations

from service.kube.credentials import Credentials, followed_output, secret_body, slim_secret
from service.kube.refs import ProxyRef
from service.reporter import endpoint_of
from stacks.models import Proxy

CHANNEL = "tcp://px-crawl-a-control.proxies.svc.cluster.local:9178"
PROXY = Proxy.model_validate(
    {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "a", "namespace": "crawl"},
        "spec": {"provider": "in-cluster", "port": 3128},
    }
)
OUT = {"host": "px-crawl-a.proxies.svc.cluster.local", "port": 3128, "protocol": "http", "instanceId": "d"}
CREDS = {"username": "u", "password": "p"}


def test_a_pod_endpoint_with_a_tcp_channel_is_not_local() -> None:
    pod = endpoint_of(PROXY, stack="in-cluster", out={**OUT, "control": CHANNEL}, creds=CREDS)
    local = endpoint_of(PROXY, stack="local", out={**OUT, "control": "/state/a.ctl"}, creds=CREDS)

    assert (pod.control, pod.local) == (CHANNEL, False)
    assert (local.control, local.local) == ("/state/a.ctl", True)


def through_the_secret(control: str | None) -> dict[str, object]:
    """What a follower reads back of the credentials the leader wrote."""
    ref = ProxyRef(namespace="crawl", name="a", uid="uid-1")
    written = Credentials(host="h", port=3128, protocol="http", username="u", password="p", control=control)
    slim = slim_secret(secret_body(ref, written))
    assert slim["key"] == "crawl/a"
    return slim["credentials"].as_dict()


def test_followers_read_a_pod_channel_from_the_secret_and_push_there_too() -> None:
    creds = through_the_secret(CHANNEL)
    follower = endpoint_of(
        PROXY, stack="in-cluster", out=followed_output({"host": "h", "port": 3128}, creds), creds=creds
    )

    assert creds["control"] == CHANNEL
    assert (follower.control, follower.local, follower.password) == (CHANNEL, False, "p")


def test_a_unix_socket_is_the_leaders_own_and_never_reaches_followers() -> None:
    assert through_the_secret("/state/a.ctl")["control"] is None
    assert through_the_secret(None)["control"] is None
    follower = endpoint_of(
        PROXY, stack="local", out=followed_output({"host": "h", "port": 3128}, {}), creds={}
    )
    assert (follower.control, follower.local) == (None, False)
