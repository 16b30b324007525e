"""The Automation API's command runner for a Pulumi CLI at any path.

`auto.PulumiCommand(root=R)` insists on `R/bin/pulumi`; the CLI we run is found by `find_pulumi` (a setting,
PATH, or the checkout's `.tools/bin`) and may be named or placed otherwise.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pulumi import automation as auto
from semver import VersionInfo


class PulumiAt(auto.PulumiCommand):
    """`PulumiCommand` for the executable `cli`, with its version read once, as the SDK's own does."""

    def __init__(self, cli: Path) -> None:  # the base __init__ would build the path from a root
        self.command = str(cli)
        env = {**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true"}
        printed = subprocess.check_output([self.command, "version"], env=env, text=True).strip()
        self.version = VersionInfo.parse(printed.removeprefix("v"))
