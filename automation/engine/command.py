"""The Automation API's command runner: the one place a `pulumi` process starts, and where the fence holds.

`auto.PulumiCommand(root=R)` insists on `R/bin/pulumi`; the CLI we run is found by `find_pulumi` (a setting,
PATH, or the checkout's `.tools/bin`) and may be named or placed otherwise. Every call runs under the
watchdog (`watchdog.py`) and is registered with the term it belongs to (`term.py`): a term that has ended
starts no operation, and the children of a term die with it and with this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from pulumi import automation as auto
from pulumi.automation._cmd import CommandResult, OnOutput, _fixup_path
from pulumi.automation.errors import create_command_error
from semver import VersionInfo

from automation.engine.config import cli_version
from automation.engine.term import Term, TermEndedError, is_operation

WATCHDOG = Path(__file__).with_name("watchdog.py")
TERM_ENV = "PROXY_OPERATOR_TERM"  # the term a CLI call belongs to, in its environment (for audits and tests)


class PulumiAt(auto.PulumiCommand):
    """`PulumiCommand` for the executable `cli`, with its version read once, as the SDK's own does.

    `fenced`: operations outside a term are refused (the in-cluster engine: only a leader's term acts).
    """

    def __init__(
        self, cli: Path, *, fenced: bool = False, grace: float = 10.0, version: str | None = None
    ) -> None:
        # the base __init__ would build the path from a root
        self.command = str(cli)
        self.fenced = fenced
        self.grace = grace  # how long a watchdog waits after SIGINT before it kills the CLI
        self.term: Term | None = None
        printed = version if version is not None else cli_version(cli)  # given: read ahead (core.py)
        self.version = VersionInfo.parse(printed.removeprefix("v"))

    def for_term(self, term: Term | None) -> PulumiAt:
        """This runner with every call belonging to `term` (a copy: the CLI's version is not read again)."""
        bound = object.__new__(PulumiAt)
        bound.__dict__.update(self.__dict__)
        bound.term = term
        return bound

    def run(
        self,
        args: list[str],
        cwd: str,
        additional_env: Mapping[str, str],
        on_output: OnOutput | None = None,
        on_error: OnOutput | None = None,
    ) -> CommandResult:
        """As the SDK's `PulumiCommand.run`, under the watchdog and the term."""
        separator = args.index("--") if "--" in args else len(args)
        if "--non-interactive" not in args[:separator]:
            args.insert(0, "--non-interactive")
        term = self.term
        if term is None:
            if self.fenced and is_operation(args):
                raise TermEndedError(f"no leadership term: `pulumi {' '.join(args[:3])}` was not started")
            term = _UNBOUND
        env = {**os.environ, **additional_env, "PULUMI_AUTOMATION_API": "true", TERM_ENV: term.name}
        if os.path.isabs(self.command):
            env = _fixup_path(env, os.path.dirname(self.command))

        def start(valid_until: float) -> tuple[subprocess.Popen[str], int]:
            read, write = os.pipe()
            try:
                process = subprocess.Popen(
                    self._watched(read, valid_until, args),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=cwd,
                    env=env,
                    encoding="utf-8",
                    pass_fds=(read,),
                )
            except BaseException:
                os.close(write)
                raise
            finally:
                os.close(read)
            return process, write

        child = term.spawn(start, args)
        try:
            stdout, stderr = _collect(child.process, on_output, on_error)
            code = child.process.wait()
        finally:
            term.finished(child)
        result = CommandResult(stderr="\n".join(stderr), stdout="\n".join(stdout), code=code)
        if code != 0:
            raise create_command_error(result)
        return result

    def _watched(self, fd: int, valid_until: float, args: list[str]) -> list[str]:
        return [
            sys.executable,
            "-S",
            "-E",
            str(WATCHDOG),
            str(fd),
            repr(valid_until),
            repr(self.grace),
            "--",
            self.command,
            *args,
        ]


# Calls made outside any term (folder mode's reads before a controller exists, one-shot commands): they are
# still watched, so they die with this process.
_UNBOUND = Term("unbound")


def _collect(
    process: subprocess.Popen[str], on_output: OnOutput | None, on_error: OnOutput | None
) -> tuple[list[str], list[str]]:
    """Read both streams to their end, line by line, calling back as the SDK does."""
    stdout: list[str] = []
    stderr: list[str] = []

    def consume(stream: object, callback: OnOutput | None, chunks: list[str]) -> None:
        assert hasattr(stream, "readline")
        assert hasattr(stream, "close")
        for line in iter(stream.readline, ""):
            stripped = line.rstrip()
            if callback:
                callback(stripped)
            chunks.append(stripped)
        stream.close()

    readers = [
        threading.Thread(target=consume, args=(process.stdout, on_output, stdout), daemon=True),
        threading.Thread(target=consume, args=(process.stderr, on_error, stderr), daemon=True),
    ]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    return stdout, stderr
