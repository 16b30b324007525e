"""What this engine last wrote as a stack's config: an operation with the same config skips `config set-all`.

A stack's config lives in its work directory's `Pulumi.<stack>.yaml` (not in the backend: term.py), and
writing it is a CLI call of its own, about 0.4 s before every `up` (docs/operations.md, "Benchmarks"). The
engine records, per stack, a digest of the config it set, the term it set it in and a digest of the file
right after. The next `up` or `preview` of that stack skips the call only when all three still hold:

- the same term (`Engine.in_term`; None for an engine outside terms): a new leadership term writes again,
  whatever an earlier term of this process wrote;
- the same config, every key, value and secret flag (only a digest is kept, not the values);
- the file unchanged since, byte for byte: anyone else who writes it (another process sharing the state
  folder, a person's `pulumi config set`, a stack re-created in this folder) makes the next call write again.

The engine forgets a stack's entry when an operation on it fails, before an `up` with refresh, when it
creates the stack and when it destroys it: after any of these the next operation writes the config again.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SETTINGS_SUFFIXES = (".yaml", ".yml", ".json")  # what LocalWorkspace looks for, in its order


@dataclass(frozen=True)
class Written:
    term: object | None  # the Term it was written in (compared by identity)
    config: str  # digest of the config set
    file: str  # digest of Pulumi.<stack>.yaml right after


def config_digest(config: Mapping[str, tuple[str, bool]]) -> str:
    """A digest of {key: (value, secret)}."""
    canonical = json.dumps(sorted((key, value, secret) for key, (value, secret) in config.items()))
    return hashlib.sha256(canonical.encode()).hexdigest()


def settings_file(work_dir: Path, stack: str) -> Path | None:
    """The stack's settings file in `work_dir`, as LocalWorkspace finds it; None when there is none."""
    name = stack.rsplit("/", 1)[-1]
    for suffix in SETTINGS_SUFFIXES:
        path = work_dir / f"Pulumi.{name}{suffix}"
        if path.is_file():
            return path
    return None


def _file_digest(work_dir: Path, stack: str) -> str | None:
    path = settings_file(work_dir, stack)
    return None if path is None else hashlib.sha256(path.read_bytes()).hexdigest()


class ConfigCache:
    """Per stack, what was written when (see the module's docstring). Shared by an engine's term views."""

    def __init__(self) -> None:
        self._written: dict[str, Written] = {}
        self._lock = threading.Lock()  # operations on different stacks run in parallel threads

    def holds(self, *, stack: str, term: object | None, config: str, work_dir: Path) -> bool:
        """Does the stack's file still hold `config`, written in `term`?"""
        with self._lock:
            written = self._written.get(stack)
        if written is None or written.term is not term or written.config != config:
            return False
        return _file_digest(work_dir, stack) == written.file

    def record(self, *, stack: str, term: object | None, config: str, work_dir: Path) -> None:
        """`config` was just written to the stack's file in `term`."""
        file = _file_digest(work_dir, stack)
        with self._lock:
            if file is None:
                self._written.pop(stack, None)
            else:
                self._written[stack] = Written(term=term, config=config, file=file)

    def forget(self, stack: str) -> None:
        with self._lock:
            self._written.pop(stack, None)

    def entries(self) -> dict[str, tuple[str, str]]:
        """{stack: (config digest, file digest)}: what an engine host hands back to the service, which gives
        it to the term's next host (automation/engine/hosted.py), so an idle host's exit costs no write."""
        with self._lock:
            return {stack: (written.config, written.file) for stack, written in self._written.items()}

    def adopt(self, entries: Mapping[str, tuple[str, str]], term: object | None) -> None:
        """Take `entries` as written in `term` (the same leadership term's earlier host wrote them)."""
        with self._lock:
            for stack, (config, file) in entries.items():
                self._written.setdefault(stack, Written(term=term, config=config, file=file))
