"""Applying an edited configuration to a running proxy (SIGHUP), so an egress or credentials edit does not
restart the fleet: open connections, their tunnels and the lease users all stay.

The `local` provider rewrites the config file and sends SIGHUP; the proxy reads the file again and, when
only what it can change in place differs (`egress`, `sources`, the static `password`, and `username` while
it stays set), uses the new values for every connection judged from then on. It answers through
`<config>.applied`: `ok <sha256 of the file>` when applied, `refused <sha256>: <why>` when the edit needs a
new process (`bind`, `port`, `protocol`, `control`, `limits`, or authentication turned on or off). The
provider waits for the digest of what it wrote, so an answer to an older edit is never taken for this one.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import fields
from pathlib import Path

from stacks.forward_proxy.config import ProxyConfig

IN_PLACE = frozenset({"egress", "sources", "username", "password"})


def applied_path(config_file: Path) -> Path:
    return config_file.with_name(config_file.name + ".applied")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def needs_new_process(old: ProxyConfig, new: ProxyConfig) -> list[str]:
    """The fields whose change a running proxy cannot take (empty: it can take the whole edit)."""
    fixed = [f.name for f in fields(ProxyConfig) if f.name not in IN_PLACE]
    changed = [name for name in fixed if getattr(old, name) != getattr(new, name)]
    if (old.username is None) != (new.username is None):
        changed.append("username")  # authentication on or off: the control channel comes or goes
    return changed


def reload(current: ProxyConfig, config_file: Path) -> ProxyConfig:
    """The configuration to use after a SIGHUP (the current one when the edit cannot be taken), with the
    answer written to `<config>.applied`."""
    try:
        data = config_file.read_bytes()
        new = ProxyConfig.parse(data)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _answer(config_file, f"refused {digest(b'')}: cannot read {config_file}: {exc}")
        return current
    blocked = needs_new_process(current, new)
    if blocked:
        _answer(config_file, f"refused {digest(data)}: {', '.join(blocked)} need a new process")
        return current
    _answer(config_file, f"ok {digest(data)}")
    return new


def _answer(config_file: Path, text: str) -> None:
    path = applied_path(config_file)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)  # whole answers only
    print(f"config reload: {text}", flush=True)
