"""The `local` provider type: each proxy is a process on this machine, run by a dynamic provider; or,
with the entry's `processModel: shared`, a port of one listener process per entry (`local_shared.py`).

The process is `stacks.forward_proxy` (HTTP + CONNECT, or SOCKS5): it enforces the egress policy on the
address it connects to, and admits only `allowedSourceRanges` (when set). It starts with a minimal
environment and reads its credentials and policy from a 0600 file in the state folder.

A proxy with credentials also listens on a control socket in the state folder (`<stem>.ctl`, 0600), where
the discovery service adds and revokes per-lease users at run time (`stacks/forward_proxy/control.py`); its
path is the endpoint's `control` output.

The proxy's limits (deadlines for a request head and a SOCKS5 handshake, the relay idle limit, connection
caps per source and in all) are the defaults of `stacks/forward_proxy/config.py`: the Proxy spec has no
field for them, so the config file carries the defaults.

`read` reports the resource gone when the process died, or when its pid now belongs to another process or
program (`stacks/forward_proxy/identity.py`), so `refresh` drops it from state and the next `up` starts it
again. A change of port, protocol or bind address replaces the process (stop first: the new one wants the
same port); an egress, allowed-sources or credentials edit is applied to the running process in place
(`local_reload.py`), so an egress edit does not restart the fleet nor cut its tunnels and lease users.

The endpoint output carries the instance id (`<pid>-<start time>`) and, on every local endpoint, the key
`control` (None without credentials): from them the service knows an endpoint is a process on its machine
and probes it only while that very process holds the port (`service/health/listener.py`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider, UpdateResult

from stacks.forward_proxy import identity
from stacks.forward_proxy.config import ProxyConfig
from stacks.forward_proxy.control import socket_path
from stacks.models import LocalProvider
from stacks.programs import dynamic_pickling, local_props, local_reload
from stacks.programs import local_process as proc
from stacks.programs.component import ControlledEndpoint, ProxyEndpoint, child_opts
from stacks.programs.context import ProgramSettings, ProxyContext
from stacks.programs.local_props import RUNTIME_OUTPUTS
from stacks.programs.local_shared import LocalSharedProxyProvider

_ref = local_props.ref_of


def _control(props: dict[str, Any]) -> str | None:
    """Lease users only where there is authentication to scope (no credentials: no channel)."""
    if not props.get("username"):
        return None
    return socket_path(Path(props["state_dir"]), props["stem"])


def _config(props: dict[str, Any]) -> ProxyConfig:
    return local_props.config_of(props, control=_control(props))


def _stop_interrupted(starting: Path, config_file: Path) -> None:
    """Stop the proxy an interrupted create of this proxy started: the engine holds it as a pending create
    with no pid, so nothing else would (and it holds the port the new process needs). Only a process that
    is still the one recorded (pid and start time) and runs on this proxy's own config file is stopped; a
    forgotten (skip-cleanup) proxy has no such file: its create finished."""
    try:
        recorded = json.loads(starting.read_text())
        ref = proc.ProcessRef(pid=int(recorded["pid"]), start_time=int(recorded["start_time"]))
    except (OSError, ValueError, KeyError, TypeError):
        return
    if proc.is_running(ref) and str(config_file) in identity.command_line(ref.pid):
        proc.stop(ref)
    starting.unlink(missing_ok=True)


class LocalProxyProvider(ResourceProvider):
    """CRUD for one proxy process; instances are stateless so dill pickles them by reference."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        state_dir = Path(props["state_dir"])
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        log_path = state_dir / f"{props['stem']}.log"
        config_file = state_dir / f"{props['stem']}.json"
        starting = state_dir / f"{props['stem']}.starting"
        _stop_interrupted(starting, config_file)
        config = _config(props)
        config.write(config_file)
        ref = proc.spawn(proc.proxy_command(config_file), log_path=log_path)
        # Until create returns (and the engine records it), only this file knows the process: a create cut
        # short (the service SIGKILLed mid-`up`) leaves it, and the next create stops that orphan first.
        starting.write_text(json.dumps({"pid": ref.pid, "start_time": ref.start_time}))
        host = proc.probe_host(props["bind_address"])
        try:
            proc.wait_until_listening(ref, host=host, port=int(props["port"]), log_path=log_path)
        except BaseException:
            proc.stop(ref)
            raise
        finally:
            starting.unlink(missing_ok=True)
        runtime = {"pid": ref.pid, "start_time": ref.start_time, "log_path": str(log_path)}
        outs = {**props, **runtime, "control": config.control}
        return CreateResult(id_=ref.instance_id, outs=outs)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        ref = _ref(props)
        if ref is None or not identity.is_ours(ref):
            return ReadResult(id_="", outs={})  # gone: refresh drops it, the next up recreates it
        return ReadResult(id_=id_, outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return local_props.diff(olds, news)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        # The running process stays: an edit it can take is applied to it in place (its tunnels and lease
        # users stay); bookkeeping inputs (state_dir, stem) only move in state, its files stay where it has
        # them.
        if any(olds.get(key) != news.get(key) for key in local_reload.IN_PLACE):
            where = {"state_dir": olds["state_dir"], "stem": olds["stem"]}
            config_file = Path(olds["state_dir"]) / f"{olds['stem']}.json"
            local_reload.apply(_ref(olds), _config({**news, **where}), config_file)
        return UpdateResult(outs={**news, **{key: olds.get(key) for key in RUNTIME_OUTPUTS}})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        ref = _ref(props)
        if ref is not None:
            proc.stop(ref)
        stem = props.get("stem")
        if stem and props.get("state_dir"):
            for suffix in (".json", ".auth", ".starting"):  # .auth: pproxy's file, from before the upgrade
                Path(props["state_dir"], f"{stem}{suffix}").unlink(missing_ok=True)
        if props.get("control"):  # the proxy removes it on a clean exit; not after a SIGKILL
            Path(props["control"]).unlink(missing_ok=True)


class LocalProxy(Resource, module="proxy-operator", name="LocalProxy"):
    pid: pulumi.Output[int]
    start_time: pulumi.Output[int]
    log_path: pulumi.Output[str]
    control: pulumi.Output[str | None]

    def __init__(
        self,
        name: str,
        props: dict[str, Any],
        opts: pulumi.ResourceOptions | None = None,
        *,
        provider: ResourceProvider | None = None,
    ) -> None:
        """One type for both process models, so a switch is a replace of each proxy (delete first: the new
        listener wants the same port), run by the provider each state names (`local_props.REPLACE_ON`)."""
        outputs = {key: None for key in RUNTIME_OUTPUTS}
        secret = pulumi.ResourceOptions(additional_secret_outputs=["password"])
        super().__init__(
            provider or LocalProxyProvider(),
            name,
            {**props, **outputs},
            pulumi.ResourceOptions.merge(opts, secret),
        )
        dynamic_pickling.unstack()


def state_dir(entry: LocalProvider, settings: ProgramSettings) -> Path:
    return Path(entry.state_dir) if entry.state_dir else Path(settings.root_dir) / ".state" / "local-proxies"


def _proxy(entry: LocalProvider, ctx: ProxyContext, settings: ProgramSettings) -> ProxyEndpoint:
    spec = ctx.proxy.spec
    bind = spec.local.bind_address if spec.local else entry.bind_address
    props: dict[str, Any] = {
        "key": ctx.proxy.key,
        "stem": re.sub(r"[^A-Za-z0-9.-]+", "_", ctx.proxy.key),
        "state_dir": str(state_dir(entry, settings).resolve()),
        "bind_address": bind,
        "port": spec.port,
        "protocol": spec.protocol.value,
        "username": ctx.credentials.username if ctx.credentials else None,
        "password": ctx.credentials.password if ctx.credentials else None,
        "egress": ctx.egress.model_dump(by_alias=True, mode="json"),
        "sources": list(spec.allowed_source_ranges),
    }
    provider: ResourceProvider | None = None
    if entry.process_model == "shared":  # absent otherwise: states from before the setting stay unchanged
        props |= {"process_model": "shared", "entry": entry.name}
        provider = LocalSharedProxyProvider()
    process = LocalProxy(ctx.proxy.key, props, child_opts(ctx.component), provider=provider)
    return ControlledEndpoint(  # every local endpoint has the key, None without credentials
        host=proc.probe_host(bind),
        port=spec.port,
        protocol=spec.protocol.value,
        instance_id=process.id,
        control=process.control,
    )


def build(
    entry: LocalProvider, contexts: list[ProxyContext], settings: ProgramSettings
) -> dict[str, ProxyEndpoint]:
    return {ctx.proxy.key: _proxy(entry, ctx, settings) for ctx in contexts}
