"""Console script `pulumi-resource-pulumi-python`: the Pulumi plugin that serves Python dynamic providers.

What the release bundle's shell launcher of that name does (`python -u -m pulumi.dynamic`), with the
interpreter of the environment this package is installed in. Kept apart from `automation.engine` (where the
language host lives) so that starting a provider does not import the engine first.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.execv(sys.executable, [sys.executable, "-u", "-m", "pulumi.dynamic", *sys.argv[1:]])
