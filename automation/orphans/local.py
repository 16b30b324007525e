"""Local orphans: processes `python -m stacks.forward_proxy <config>` whose config file lies under the state
folder of one of this installation's `local` catalogue entries. A local process carries no tag of its own;
its state folder is the mark (two installations on one machine must not share a stateDir). The state side:
every instance id (`<pid>-<start time>`) in the `proxies` output of any stack of the backend.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from automation.orphans.model import LocalProcess, Orphan

FORWARD_PROXY_MODULE = "stacks.forward_proxy"


def known_instance_ids(outputs: Iterable[Mapping[str, Any]]) -> set[str]:
    """Every instance id the stacks' `proxies` outputs name."""
    found: set[str] = set()
    for stack in outputs:
        for item in (stack.get("proxies") or {}).values():
            if isinstance(item, Mapping) and item.get("instanceId"):
                found.add(str(item["instanceId"]))
    return found


def local_orphans(
    processes: Iterable[LocalProcess], *, state_dirs: Mapping[str, Path], known: set[str]
) -> list[Orphan]:
    """Processes under one of `state_dirs` (entry name -> folder) whose instance id no stack holds."""
    orphans = []
    for process in processes:
        entry = next((name for name, d in state_dirs.items() if process.config.is_relative_to(d)), None)
        if entry is not None and process.instance_id not in known:
            detail = f"pid {process.pid}, config {process.config}"
            orphans.append(Orphan(entry, "process", process.instance_id, detail, process))
    return orphans


def forward_proxy_processes(proc: Path = Path("/proc")) -> list[LocalProcess]:
    """Our forward-proxy processes on this machine, from /proc (pid, start time, config file)."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            args = [a.decode(errors="replace") for a in argv if a]
            if FORWARD_PROXY_MODULE in args and args[-1] != FORWARD_PROXY_MODULE:
                started = _start_time(entry / "stat")
                if started is not None:
                    found.append(LocalProcess(int(entry.name), started, Path(args[-1]).resolve()))
    return found


def stop_local(orphan: Orphan) -> bool:
    """SIGTERM the orphan's process, only if its pid still belongs to the same process (start time)."""
    process = orphan.process
    if process is None or _start_time(Path(f"/proc/{process.pid}/stat")) != process.start_time:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    return True


def _start_time(stat: Path) -> int | None:
    try:
        text = stat.read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return int(fields[19]) if fields[0] != "Z" else None
