"""A stack's work directory: its `Pulumi.yaml`, written whole or not at all.

`LocalWorkspace(project_settings=...)` rewrites `Pulumi.yaml` in place (truncate, then write) each time a
workspace is made, and two operations on one stack can overlap in a replica (the term's first read of the
backend beside the reconciler's run): the CLI of one read the file the other had just truncated ("could
not validate Pulumi.yaml: expected project to be an object, was '<nil>'", seen in CI). Here the file is
written to a temporary name and renamed over the old one, and only when its text changes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

PROJECT_FILE = "Pulumi.yaml"


def write_project_file(work_dir: Path, settings: dict[str, Any]) -> Path:
    """Write `settings` (ProjectSettings.to_dict()) as `work_dir/Pulumi.yaml` atomically; unchanged text
    is not written again."""
    path = work_dir / PROJECT_FILE
    text = yaml.safe_dump(settings, sort_keys=True)
    try:
        if path.read_text(encoding="utf-8") == text:
            return path
    except FileNotFoundError:
        pass
    fd, temporary = tempfile.mkstemp(dir=work_dir, prefix=".Pulumi.yaml.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
