"""`processModel: shared`: every proxy of a `local` entry served by one listener process, each on its own
port with its own configuration (`stacks/forward_proxy/shared_listener.py`; the listener's files and
client: `local_listener.py`).

The resource is still one per proxy, of the same type as a proxy's own process (`local.LocalProxy`), so
refresh, drift and forgetting work per proxy as they do there:

- `create` writes the proxy's config (`<stem>.json`, 0600), starts the entry's listener if none runs, has
  it serve the proxy, and returns once the port accepts. Its id and outputs name the listener's process
  (`<pid>-<start time>`), so the service's probe gate checks that this very process holds the port.
- `read` reports the proxy gone when the recorded listener died, its pid now runs something else, or it no
  longer serves this proxy on this port: a refresh drops it and the next `up` serves it again (in a new
  listener when the old one died: every proxy of the entry then comes back in that one `up`).
- `update` applies egress, allowed sources and credentials in place (the listener reads the file again);
  a change of port, protocol, bind address or of the process model replaces the proxy (`local_props`).
- `delete` drops only this proxy's port (its connections are cut) and stops the listener with its last
  proxy. A forgotten proxy (skip-cleanup) is never deleted, so its port keeps the listener running.

Lease users go over the listener's socket, naming the proxy: the endpoint's `control` is
`shared:NAMESPACE/NAME@<socket>` (None without credentials).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pulumi.dynamic import CreateResult, DiffResult, ReadResult, ResourceProvider, UpdateResult

from stacks.forward_proxy.channel import shared_channel
from stacks.programs import local_process as proc
from stacks.programs import local_props
from stacks.programs.local_listener import SharedListener, SharedListenerError
from stacks.programs.local_props import RUNTIME_OUTPUTS, config_file, ref_of
from stacks.programs.local_reload import IN_PLACE, InPlaceEditFailed


def _listener(props: dict[str, Any]) -> SharedListener:
    return SharedListener(Path(props["state_dir"]), props["entry"])


def _channel(props: dict[str, Any], listener: SharedListener) -> str | None:
    """Lease users only where there is authentication to scope (no credentials: no channel)."""
    return shared_channel(listener.control, props["key"]) if props.get("username") else None


class LocalSharedProxyProvider(ResourceProvider):
    """CRUD for one proxy of a shared listener; stateless, so dill pickles it by reference."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        listener = _listener(props)
        path = config_file(props)
        with listener.locked():
            local_props.config_of(props, control=None).write(path)
            ref = listener.ensure()
            listener.call({"op": "serve", "proxy": props["key"], "config": str(path)})
        host, port = proc.probe_host(props["bind_address"]), int(props["port"])
        if not proc.accepts_within(host, port):
            raise proc.ProxyStartError(
                f"the shared listener serves {props['key']} but {host}:{port} does not "
                f"accept: {proc.tail(listener.log_path)}"
            )
        runtime = {"pid": ref.pid, "start_time": ref.start_time, "log_path": str(listener.log_path)}
        return CreateResult(
            id_=ref.instance_id, outs={**props, **runtime, "control": _channel(props, listener)}
        )

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        listener = _listener(props)
        if not listener.is_ours(ref_of(props)):
            return ReadResult(id_="", outs={})  # gone: refresh drops it, the next up serves it again
        try:
            served = listener.call({"op": "status", "proxy": props["key"]})["served"]
        except SharedListenerError:
            return ReadResult(id_="", outs={})
        wanted = {"bind": props["bind_address"], "port": int(props["port"]), "protocol": props["protocol"]}
        if served != wanted:
            return ReadResult(id_="", outs={})
        return ReadResult(id_=id_, outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return local_props.diff(olds, news)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        where = {"state_dir": olds["state_dir"], "stem": olds["stem"]}  # its files stay where it has them
        if any(olds.get(key) != news.get(key) for key in IN_PLACE):
            listener = _listener(olds)
            if not listener.is_ours(ref_of(olds)):
                raise InPlaceEditFailed(
                    f"the shared listener of {olds['key']} is gone; the next refresh recreates it with "
                    "the edit"
                )
            local_props.config_of({**news, **where}, control=None).write(config_file(olds))
            try:
                listener.call({"op": "reload", "proxy": olds["key"]})
            except SharedListenerError as exc:
                raise InPlaceEditFailed(
                    f"the shared listener refused the edit of {olds['key']}: {exc}"
                ) from exc
        return UpdateResult(outs={**news, **{key: olds.get(key) for key in RUNTIME_OUTPUTS}})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        listener = _listener(props)
        ref = ref_of(props)
        with listener.locked():
            if ref is not None and listener.is_ours(ref):
                remaining = listener.call({"op": "drop", "proxy": props["key"]})["remaining"]
                if remaining == 0:
                    listener.stop(ref)
        config_file(props).unlink(missing_ok=True)
