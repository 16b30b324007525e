"""Console script `pulumi-resource-pulumi-python`: the Pulumi plugin that serves Python dynamic providers.

What the SDK's shell launcher of that name does (`python -u -m pulumi.dynamic`), with two differences:
- the interpreter is the one of the environment this package is installed in;
- the provider dies with the CLI that started it (`automation.parent_watch`): the SDK's launcher runs
  Python as the child of a shell that waits, so a SIGKILLed CLI left both running, and a Create already in
  the provider could finish after the leadership term that started it had ended.
Kept apart from `automation.engine` (where the language host lives) so that starting a provider does not
import the engine first.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    """The console script: re-exec unbuffered (the SDK's provider writes its port without a flush) as
    `python -u -m automation.dynamic_provider`, replacing this process so the CLI stays its parent."""
    os.execv(sys.executable, [sys.executable, "-u", "-m", "automation.dynamic_provider", *sys.argv[1:]])


def serve() -> None:
    from automation.parent_watch import exit_with_parent

    exit_with_parent()
    runpy.run_module("pulumi.dynamic", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    serve()
