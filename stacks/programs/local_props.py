"""The inputs of a `local` proxy resource, as both process models read them (`local.py`: a process per
proxy; `local_shared.py`: one shared listener per entry): its config file, its process, and its diff."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pulumi.dynamic import DiffResult

from stacks.forward_proxy.config import ProxyConfig
from stacks.forward_proxy.identity import ProcessRef
from stacks.models import EgressSpec

# A new listener: what it listens on and speaks, and the process model (a switch replaces every proxy of
# the entry: stop, then start under the other model). Egress, allowed sources and credentials are edited in
# place unless authentication is turned on or off (the control channel comes or goes).
REPLACE_ON = ("bind_address", "port", "protocol", "process_model")
RUNTIME_OUTPUTS = ("pid", "start_time", "log_path", "control")


def ref_of(props: dict[str, Any]) -> ProcessRef | None:
    if props.get("pid") is None or props.get("start_time") is None:
        return None
    return ProcessRef(pid=int(props["pid"]), start_time=int(props["start_time"]))


def config_file(props: dict[str, Any]) -> Path:
    return Path(props["state_dir"]) / f"{props['stem']}.json"


def config_of(props: dict[str, Any], *, control: str | None) -> ProxyConfig:
    return ProxyConfig(
        bind=props["bind_address"],
        port=int(props["port"]),
        protocol=props["protocol"],
        egress=EgressSpec.model_validate(props.get("egress") or {}),
        sources=tuple(props.get("sources") or ()),
        username=props.get("username") or None,
        password=props.get("password") or None,
        control=control,
    )


def diff(olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
    replaces = [key for key in REPLACE_ON if olds.get(key) != news.get(key)]
    if bool(olds.get("username")) != bool(news.get("username")):
        replaces.append("username")
    changed = [key for key in news if key not in RUNTIME_OUTPUTS and olds.get(key) != news.get(key)]
    return DiffResult(changes=bool(changed), replaces=replaces, delete_before_replace=True)
