"""The `local` provider type: each proxy is a pproxy process on this machine, run by a dynamic provider.

`read` reports the resource gone when the process died (or its pid now belongs to someone else), so
`refresh` drops it from state and the next `up` starts it again. A change of port, protocol, bind address or
credentials replaces the process (stop first: the new one wants the same port).

pproxy has no source allow-list: `allowedSourceRanges` is enforced only through the bind address (bind to
127.0.0.1 and only this machine can connect). The program warns when ranges are set on a wider bind.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider, UpdateResult

from stacks.models import LocalProvider
from stacks.programs import local_process as proc
from stacks.programs.component import ProxyEndpoint, child_opts
from stacks.programs.context import ProgramSettings, ProxyContext

REPLACE_ON = ("bind_address", "port", "protocol", "username", "password")
RUNTIME_OUTPUTS = ("pid", "start_time", "log_path")


def _ref(props: dict[str, Any]) -> proc.ProcessRef | None:
    if props.get("pid") is None or props.get("start_time") is None:
        return None
    return proc.ProcessRef(pid=int(props["pid"]), start_time=int(props["start_time"]))


def _write_auth_file(path: Path, username: str, password: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{username}:{password}\n")


class LocalProxyProvider(ResourceProvider):
    """CRUD for one pproxy process; instances are stateless so dill pickles them by reference."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        state_dir = Path(props["state_dir"])
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        log_path = state_dir / f"{props['stem']}.log"
        auth_file = None
        if props.get("username"):
            auth_file = state_dir / f"{props['stem']}.auth"
            _write_auth_file(auth_file, props["username"], props["password"])
        command = proc.pproxy_command(
            scheme=props["protocol"], bind=props["bind_address"], port=int(props["port"]), auth_file=auth_file
        )
        ref = proc.spawn(command, log_path=log_path)
        host = proc.probe_host(props["bind_address"])
        proc.wait_until_listening(ref, host=host, port=int(props["port"]), log_path=log_path)
        outs = {**props, "pid": ref.pid, "start_time": ref.start_time, "log_path": str(log_path)}
        return CreateResult(id_=f"{ref.pid}-{ref.start_time}", outs=outs)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        ref = _ref(props)
        if ref is None or not proc.is_running(ref):
            return ReadResult(id_="", outs={})  # gone: refresh drops it, the next up recreates it
        return ReadResult(id_=id_, outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [key for key in REPLACE_ON if olds.get(key) != news.get(key)]
        changed = [key for key in news if key not in RUNTIME_OUTPUTS and olds.get(key) != news.get(key)]
        return DiffResult(changes=bool(changed), replaces=replaces, delete_before_replace=True)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        # Only bookkeeping inputs (state_dir, stem) reach here: the running process stays as it is.
        return UpdateResult(outs={**news, **{key: olds.get(key) for key in RUNTIME_OUTPUTS}})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        ref = _ref(props)
        if ref is not None:
            proc.stop(ref)
        stem = props.get("stem")
        if stem and props.get("state_dir"):
            Path(props["state_dir"], f"{stem}.auth").unlink(missing_ok=True)


class LocalProxy(Resource, module="proxy-operator", name="LocalProxy"):
    pid: pulumi.Output[int]
    start_time: pulumi.Output[int]
    log_path: pulumi.Output[str]

    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        outputs = {key: None for key in RUNTIME_OUTPUTS}
        secret = pulumi.ResourceOptions(additional_secret_outputs=["password"])
        super().__init__(
            LocalProxyProvider(), name, {**props, **outputs}, pulumi.ResourceOptions.merge(opts, secret)
        )


def state_dir(entry: LocalProvider, settings: ProgramSettings) -> Path:
    return Path(entry.state_dir) if entry.state_dir else Path(settings.root_dir) / ".state" / "local-proxies"


def _warn_if_ranges_unenforced(ctx: ProxyContext, bind: str) -> None:
    ranges = ctx.proxy.spec.allowed_source_ranges
    if ranges and not ipaddress.ip_address(bind).is_loopback:
        pulumi.log.warn(
            f"{ctx.proxy.key}: pproxy cannot filter sources, so allowedSourceRanges {ranges} is not enforced "
            f"on {bind}; bind to 127.0.0.1 or use another provider type"
        )


def _proxy(entry: LocalProvider, ctx: ProxyContext, settings: ProgramSettings) -> ProxyEndpoint:
    spec = ctx.proxy.spec
    bind = spec.local.bind_address if spec.local else entry.bind_address
    _warn_if_ranges_unenforced(ctx, bind)
    props: dict[str, Any] = {
        "key": ctx.proxy.key,
        "stem": re.sub(r"[^A-Za-z0-9.-]+", "_", ctx.proxy.key),
        "state_dir": str(state_dir(entry, settings).resolve()),
        "bind_address": bind,
        "port": spec.port,
        "protocol": spec.protocol.value,
        "username": ctx.credentials.username if ctx.credentials else None,
        "password": ctx.credentials.password if ctx.credentials else None,
    }
    process = LocalProxy(ctx.proxy.key, props, child_opts(ctx.component))
    return ProxyEndpoint(
        host=proc.probe_host(bind), port=spec.port, protocol=spec.protocol.value, instance_id=process.id
    )


def build(
    entry: LocalProvider, contexts: list[ProxyContext], settings: ProgramSettings
) -> dict[str, ProxyEndpoint]:
    return {ctx.proxy.key: _proxy(entry, ctx, settings) for ctx in contexts}
