"""Editing a running `local` proxy in place: an egress, allowed-sources or credentials edit reaches the
process without restarting it, so its tunnels and lease users stay (`stacks/forward_proxy/reload.py` is the
proxy's half).

The provider writes the new configuration over the file the process was started with, sends SIGHUP, and
waits (`APPLY_TIMEOUT`) until the proxy says in `<config>.applied` that it applied exactly that file. A
process that is gone, a refusal or no answer fails the update with the reason: the engine keeps the old
inputs in state, and the next run tries again (and a refresh finds a dead process and recreates it).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from stacks.forward_proxy import identity
from stacks.forward_proxy import reload as proxy_reload
from stacks.forward_proxy.config import ProxyConfig
from stacks.programs import local_process as proc

APPLY_TIMEOUT = 10.0
IN_PLACE = tuple(sorted(proxy_reload.IN_PLACE))  # the inputs a running proxy takes (props' names)


class InPlaceEditFailed(RuntimeError):
    """The running proxy did not take the edit; the message says why and what happens next."""


def apply(ref: proc.ProcessRef | None, config: ProxyConfig, config_file: Path) -> None:
    """Give the process `ref`, started on `config_file`, the configuration `config`."""
    if ref is None or not identity.is_ours(ref):  # never a signal to a process that is not that proxy
        raise InPlaceEditFailed(
            f"the proxy process of {config_file.name} is gone; the next refresh recreates it with the edit"
        )
    config.write(config_file)
    wanted = proxy_reload.digest(config_file.read_bytes())
    answer_file = proxy_reload.applied_path(config_file)
    os.kill(ref.pid, signal.SIGHUP)
    deadline = time.monotonic() + APPLY_TIMEOUT
    while time.monotonic() < deadline:
        try:
            answer = answer_file.read_text().strip()
        except OSError:
            answer = ""
        if wanted in answer:
            if answer.startswith("ok "):
                return
            raise InPlaceEditFailed(f"the proxy refused the edit of {config_file.name}: {answer}")
        time.sleep(0.02)
    raise InPlaceEditFailed(
        f"the proxy process {ref.pid} did not apply the edit of {config_file.name} within "
        f"{APPLY_TIMEOUT:g} s (see its log); the next run tries again"
    )
