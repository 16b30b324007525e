"""Each engine operation's temporary folder (the CLI's and its plugins' `TMPDIR`), and the sweep of those a
process killed before it could remove them.

An operation removes its folder when it ends, even when it fails (`Engine._operation`); a process killed
mid-operation (SIGKILL, the out-of-memory killer, a lost node) cannot, and the folder may hold what a plugin
left there: the Kubernetes plugin writes a kubeconfig given as content at each start (docs/security.md). So
the folder's name carries its process's pid, and the first operation of each process removes the folders
of this user whose process is gone. A pid that was taken again by a live process keeps its folder until
that process is gone too: never a folder of a running operation. The name also carries the process's pid
namespace (`/proc/self/ns/pid`): a temporary folder shared by containers with pid namespaces of their own
(an emptyDir of two containers, a host folder) holds pids that mean nothing here, and their folders are
left to a process of their own namespace.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

PREFIX = "proxy-operator-op-"
_NAMED = re.compile(re.escape(PREFIX) + r"(\d+)-(\d+)-")  # pid namespace, pid
_swept = threading.Event()


def pid_namespace() -> int:
    """This process's pid namespace (its inode); 0 where there is no /proc (then every pid is judged)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def own_prefix() -> str:
    """The start of the names of this process's operation folders."""
    return f"{PREFIX}{pid_namespace()}-{os.getpid()}-"


def make() -> str:
    """A new operation's folder (private to this user), after the first call swept the dead ones."""
    if not _swept.is_set():
        _swept.set()
        sweep(Path(tempfile.gettempdir()))
    return tempfile.mkdtemp(prefix=own_prefix())


def sweep(folder: Path) -> list[Path]:
    """Remove the operation folders in `folder` of this user and pid namespace whose process is gone; what
    was removed."""
    removed = []
    namespace = pid_namespace()
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            named = _NAMED.match(entry.name)
            if named is None or int(named.group(1)) != namespace or not entry.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid != os.getuid() or _alive(int(named.group(2))):
                    continue
                shutil.rmtree(entry.path)
                removed.append(Path(entry.path))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process holds the pid now
        return True
    return True
