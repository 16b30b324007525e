"""The Python language host: the `pulumi-language-python` plugin that the Pulumi CLI starts.

The CLI runs a `runtime: python` program through a plugin called `pulumi-language-python`: it starts the
plugin with the engine's address as the last argument, reads a port from the plugin's first line of output,
and talks gRPC (`pulumirpc.LanguageRuntime`) to it. Pulumi's release bundle ships a Go build of that plugin;
its Go module is not served by the module proxy this project can reach, so this distribution ships its own,
installed as the console script `pulumi-language-python` (and launched from `.tools/bin` in a checkout).

It is a thin adapter over code that Pulumi maintains: the Python SDK's own `LanguageServer` (what the
Automation API uses to run inline programs). This module only starts that server as a plugin and turns the
project's `main` into the program function. Differences from the Go host, on purpose:
- `GetRequiredPackages` reports nothing: provider plugins are loaded when a resource first needs them, so a
  stack of `local` proxies never asks for the kubernetes or gcp plugins (which cannot be downloaded here).
- Dependencies are the interpreter's own environment: `InstallDependencies` only says so.
- It dies with the CLI that started it (`automation.parent_watch`), even when the CLI is SIGKILLed.
"""

from __future__ import annotations

import importlib.metadata
import os
import runpy
import signal
import sys
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from pulumi.automation._server import LanguageServer
from pulumi.runtime import settings
from pulumi.runtime.proto import language_pb2, language_pb2_grpc, plugin_pb2

from automation.parent_watch import exit_with_parent

_VERSION = importlib.metadata.version("pulumi")
_MAX_MESSAGE = 400 * 1024 * 1024  # the engine sends whole configs and receives big registrations


def program_for(program_dir: Path, entry_point: str) -> Callable[[], None]:
    """Return a callable that runs the project's `main` the way `python <main>` would."""
    target = (program_dir / entry_point).resolve() if entry_point not in ("", ".") else program_dir.resolve()
    if target.is_dir() and (target / "__init__.py").exists():
        # A package: run it as `python -m <package>` so its absolute imports resolve.
        parent, package = str(target.parent), target.name

        def run_package() -> None:
            if parent not in sys.path:
                sys.path.insert(0, parent)
            runpy.run_module(package, run_name="__main__", alter_sys=True)

        return run_package

    def run_path() -> None:
        runpy.run_path(str(target), run_name="__main__")

    return run_path


class ProjectLanguageHost(LanguageServer):
    """The SDK's inline-program server, pointed at the project's `main` for each Run."""

    def __init__(self, engine_address: str) -> None:
        super().__init__(program=lambda: None)
        self.engine_address = engine_address
        self.running = False

    def Handshake(self, request: Any, context: Any) -> Any:
        if request.engine_address:
            self.engine_address = request.engine_address
        return language_pb2.LanguageHandshakeResponse()

    def GetPluginInfo(self, request: Any, context: Any) -> Any:
        return plugin_pb2.PluginInfo(version=_VERSION)

    def Run(self, request: Any, context: Any) -> Any:
        program_dir = Path(request.info.program_directory or request.pwd or os.getcwd())
        entry_point = request.info.entry_point or request.program or "."
        if request.pwd:
            os.chdir(request.pwd)
        program = program_for(program_dir, entry_point)
        root = request.info.root_directory or request.pwd

        def run_in_project() -> None:
            # The SDK's server resets the settings without the project root; programs read it through
            # pulumi.get_root_directory(), so set it before the program runs.
            settings.SETTINGS.root_directory = root
            program()

        self.program = run_in_project
        if not request.args:
            # LanguageServer reads the engine address from args[0]; the CLI gave it to us on argv.
            request.args.append(self.engine_address)
        self.running = True
        try:
            return super().Run(request, context)
        finally:
            self.running = False

    def InstallDependencies(self, request: Any, context: Any) -> Iterator[Any]:
        message = "dependencies come from the language host's own Python environment; nothing to install\n"
        yield language_pb2.InstallDependenciesResponse(stdout=message.encode())

    def GetProgramDependencies(self, request: Any, context: Any) -> Any:
        deps = [
            language_pb2.DependencyInfo(name=dist.metadata["Name"], version=dist.version)
            for dist in importlib.metadata.distributions()
            if dist.metadata["Name"]
        ]
        return language_pb2.GetProgramDependenciesResponse(dependencies=deps)

    def RuntimeOptionsPrompts(self, request: Any, context: Any) -> Any:
        return language_pb2.RuntimeOptionsResponse()

    def Cancel(self, request: Any, context: Any) -> Any:
        from google.protobuf import empty_pb2

        return empty_pb2.Empty()


def serve(argv: list[str]) -> int:
    exit_with_parent()  # a SIGKILLed CLI does not stop its plugins: a program must not run on without it
    positional = [arg for arg in argv if not arg.startswith("-")]
    engine_address = positional[-1] if positional else ""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        options=[
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
        ],
    )
    host = ProjectLanguageHost(engine_address)
    language_pb2_grpc.add_LanguageRuntimeServicer_to_server(host, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    # The CLI reads the port from our first line of output.
    print(port, flush=True)

    # The engine stops a plugin it is done with by SIGINT (then waits, then kills): exit at once, or every
    # operation waits for that timeout. While a program runs, a SIGINT is the user's Ctrl-C reaching the
    # whole process group: the engine drives that cancellation itself, so let the program finish.
    def on_signal(signum: int, _frame: object) -> None:
        if signum == signal.SIGTERM or not host.running:
            server.stop(grace=0)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    server.wait_for_termination()
    return 0


def main() -> None:
    """Console script `pulumi-language-python` (and `python -m automation.engine.langhost`)."""
    sys.exit(serve(sys.argv[1:]))


if __name__ == "__main__":
    main()
