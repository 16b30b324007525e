"""The Pulumi engine behind a narrow interface (`automation.engine` alone imports `pulumi.automation`).

Every stack gets its own work directory (`<state_dir>/work/<stack>`) holding a copy of the project's
`Pulumi.yaml` whose `main` is the absolute path of `stacks/`: `create/select` rewrite files in the work
directory, so two stacks sharing one would race. The program runs in the child process that the CLI starts;
the service never imports a provider SDK. Operations block (they are subprocess calls): callers run them in
threads. Pulumi's exceptions are translated into `automation.errors` here and nowhere else.

The SDK (`pulumi.automation`, and with it gRPC, protobuf and the `pulumi` package: about 33 MiB of a
process's RSS) is imported by the first operation or read, not with this module: a follower builds an
`Engine` and never runs one (docs/decisions.md, "Lazy imports of the engine"). Annotations name its types
under TYPE_CHECKING; each method that touches it at run time imports it itself (a dictionary look-up once
loaded).
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from automation.engine.config import (
    CONFIG_NAMESPACE,
    HASH_OUTPUT,
    OWNER_TAG,
    EngineConfig,
    StackInput,
)
from automation.engine.config_cache import ConfigCache, config_digest
from automation.engine.errors import STACK_NOT_FOUND, translate
from automation.engine.events import UNCHANGING, EventLogger
from automation.engine.locks import LockRecovery
from automation.engine.results import OperationResult, PreviewStep, StackInfo, steps_from_events
from automation.engine.runner import Runner
from automation.engine.scratch import make as operation_folder
from automation.engine.state_edit import remove_components
from automation.engine.term import Term
from automation.engine.workdir import write_project_file
from automation.errors import InvalidInputError

if TYPE_CHECKING:
    from pulumi import automation as auto

    from automation.engine.command import PulumiAt
    from automation.engine.hosted import EngineHost

log = logging.getLogger(__name__)

SKIP_CHECKPOINTS = "PULUMI_SKIP_CHECKPOINTS"

P = ParamSpec("P")
R = TypeVar("R")


def _hosted(method: Callable[Concatenate[Engine, P], R]) -> Callable[Concatenate[Engine, P], R]:
    """A CLI-calling method: run in the term's engine host when this view has one (automation/engine/
    hosted.py), else here. Subclasses that wrap a method (tests' counting engines) still see each call."""
    name = method.__name__

    @functools.wraps(method)
    def forward(self: Engine, *args: P.args, **kwargs: P.kwargs) -> R:
        if self._host is not None:
            result: R = self._host.call(name, *args, **kwargs)
            return result
        return method(self, *args, **kwargs)

    return forward


class Engine:
    """Runs Pulumi operations on the stacks of one project and one backend."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._runner = Runner(config.pulumi, fenced=config.fenced)  # shared by the term views
        self._bound: PulumiAt | None = None  # this view's runner, made on its first CLI call
        self._locks = LockRecovery(hostname=config.hostname, foreign_gone=config.foreign_lock_gone)
        self._written = ConfigCache()  # shared by the term views: each entry names its term
        self.term: Term | None = None
        self._host: EngineHost | None = None  # a term view's engine host (config.host_idle_seconds > 0)

    def prepare(self) -> None:
        """Read the CLI's version ahead, in a thread (a replica that may lead: its first operation, a new
        term's backend read, then waits only for the SDK's import and its own CLI calls)."""
        self._runner.prefetch()

    def in_term(self, term: Term) -> Engine:
        """This engine with every CLI call belonging to `term` (automation/engine/term.py): once the term
        has ended, its operations are refused and its running children are interrupted. A view: the
        engine itself is shared across terms and never closes."""
        bound = copy.copy(self)
        bound._bound = None
        bound.term = term
        bound._host = None
        if self.config.host_idle_seconds > 0:
            from automation.engine.hosted import EngineHost

            bound._host = EngineHost(
                self, term, idle_seconds=self.config.host_idle_seconds, grace=self.config.host_grace
            )
        return bound

    def reads_in_host(self) -> Engine:
        """This engine with its calls outside any term in an engine host whose term is closed (reads only,
        every operation refused: as a fenced engine outside a term), when `host_idle_seconds` > 0: a
        replica's `/v1/stacks` loads no SDK into it either. Its term views (`in_term`) have their own."""
        if self.config.host_idle_seconds <= 0:
            return self
        from automation.engine.hosted import EngineHost

        view = copy.copy(self)
        view._bound = None
        view._host = EngineHost(
            self, None, idle_seconds=self.config.host_idle_seconds, grace=self.config.host_grace
        )
        return view

    @property
    def _command(self) -> PulumiAt:
        """The CLI runner of this view (its term's), made on first use: making it imports the SDK and
        reads the CLI's version (one `pulumi version`), which a follower never needs."""
        bound = self._bound
        if bound is None:
            runner = self._runner.get()
            bound = self._bound = runner.for_term(self.term) if self.term is not None else runner
        return bound

    # --- operations -----------------------------------------------------------------------------------

    @_hosted
    def up(self, spec: StackInput, *, refresh: bool = False) -> OperationResult:
        if refresh:  # a repair: nothing about the stack is taken on trust, its config included
            self._written.forget(spec.name)
        # docs/decisions.md, "Checkpoints": the state saved once, when the up ends
        env = {SKIP_CHECKPOINTS: "true"} if spec.skip_checkpoints else None
        with (
            self._forgotten_on_failure(spec.name),
            self._operation(spec.name, "up", env=env) as (stack, events),
        ):
            self._configure(stack, spec)
            result = self._retry_lock(
                stack, lambda: stack.up(on_event=events, refresh=refresh, parallel=self.config.parallel)
            )
            return OperationResult.from_summary(
                stack=spec.name, kind="up", summary=result.summary, outputs=_plain(result.outputs)
            )

    @_hosted
    def preview(self, spec: StackInput) -> list[PreviewStep]:
        with self._forgotten_on_failure(spec.name), self._operation(spec.name, "preview") as (stack, events):
            self._configure(stack, spec)
            self._retry_lock(stack, lambda: stack.preview(on_event=events))
            return steps_from_events(events.events)

    def preview_new(self, spec: StackInput) -> list[PreviewStep]:
        """Preview a stack that the backend does not hold yet, writing nothing to the backend.

        The Automation API previews a selected stack only, and selecting one that does not exist creates
        it: in the shared backend that is a write, which read-only CI credentials refuse (and others would
        see the stack until it is removed). A stack that does not exist has no state to read, so this
        preview runs against a throwaway file backend and work directory in a temporary folder, deleted
        afterwards. Its stack config is encrypted with a throwaway passphrase: the secrets never leave
        that folder, and no access to the real passphrase or KMS key is needed.
        """
        with tempfile.TemporaryDirectory(prefix="proxy-operator-preview-") as scratch:
            backend = Path(scratch, "backend")
            backend.mkdir()
            throwaway = replace(
                self.config,
                backend_url=backend.as_uri(),
                state_dir=Path(scratch),
                secrets_provider="passphrase",
                passphrase=secrets.token_urlsafe(24),
                fenced=False,  # a throwaway backend in a temporary folder: nobody else's stack
            )
            return Engine(throwaway).preview(spec)

    @_hosted
    def preview_destroy(self, name: str) -> list[PreviewStep]:
        """What `destroy` would delete, changing nothing (the program does not run)."""
        with self._operation(name, "preview-destroy", create=False) as (stack, events):
            self._retry_lock(stack, lambda: stack.preview_destroy(on_event=events))
            return steps_from_events(events.events)

    @_hosted
    def detect_drift(self, name: str) -> list[PreviewStep]:
        """Preview a refresh: what differs between state and the real resources, changing nothing."""
        with self._operation(name, "preview-refresh", create=False) as (stack, events):
            # Only the outcomes that differ are kept: each event holds a resource's whole state, and a
            # stack of 500 shared proxies sends about 3,000 (over 100 MiB held at 10,000 proxies).
            events.keep = _drifted
            self._retry_lock(stack, lambda: stack.preview_refresh(on_event=events))
            steps = steps_from_events(events.events, outcomes=True, parents=events.parents)
            return [step for step in steps if step.op not in UNCHANGING]

    @_hosted
    def destroy(self, name: str) -> OperationResult | None:
        """Destroy every resource of a stack, then remove the stack. None when there was no stack."""
        if not self.exists(name):
            return None
        self._written.forget(name)  # gone with the stack, or half gone if this fails
        with self._operation(name, "destroy", create=False) as (stack, events):
            result = self._retry_lock(stack, lambda: stack.destroy(on_event=events))
            stack.workspace.remove_stack(name)
        return OperationResult.from_summary(stack=name, kind="destroy", summary=result.summary)

    @_hosted
    def forget(self, name: str, components: list[str]) -> dict[str, list[str]]:
        """Drop the named proxy components and their children from state; the real resources stay.

        Returns the forgotten URNs per component name (empty lists where a component was not in state).
        """
        if not self.exists(name):
            return {component: [] for component in components}
        with self._operation(name, "forget", create=False) as (stack, _events):

            def edit() -> dict[str, list[str]]:
                # Read again after a recovered lock: its dead holder may have written state before dying.
                deployment = stack.export_stack()
                edited, forgotten = remove_components(dict(deployment.deployment or {}), components)
                if any(forgotten.values()):
                    self._import_state(name, stack, {"version": deployment.version, "deployment": edited})
                return forgotten

            # The import takes the stack's lock: a dead holder's lock is recovered as for an `up`.
            result: dict[str, list[str]] = self._retry_lock(stack, edit)
            return result

    # --- inspection -----------------------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        return name in self.list_stack_names()

    @_hosted
    def list_stack_names(self) -> list[str]:
        from pulumi import automation as auto

        try:
            return sorted(summary.name for summary in self._workspace(None).list_stacks())
        except auto.errors.CommandError as exc:
            raise translate(exc, stack="*") from exc

    @_hosted
    def info(self, name: str) -> StackInfo:
        with self._operation(name, "inspect", create=False) as (stack, _events):
            deployment = dict(stack.export_stack().deployment or {})
            history = stack.history(page_size=1, page=1)
            outputs = dict(stack.outputs())
        return StackInfo.build(name=name, deployment=deployment, outputs=outputs, history=history)

    @_hosted
    def outputs(self, name: str) -> dict[str, tuple[Any, bool]]:
        """Outputs as {key: (value, is_secret)}; callers mask the secrets unless asked not to."""
        with self._operation(name, "outputs", create=False) as (stack, _events):
            return {key: (out.value, out.secret) for key, out in stack.outputs().items()}

    @_hosted
    def export(self, name: str) -> dict[str, Any]:
        with self._operation(name, "export", create=False) as (stack, _events):
            exported = stack.export_stack()
            return {"version": exported.version, "deployment": exported.deployment}

    @_hosted
    def export_stored(self, name: str) -> dict[str, Any]:
        """The state as stored, secret values still encrypted (`export` above decrypts them)."""
        return dict(self._read_json(name, ["stack", "export"]))

    @_hosted
    def plain_outputs(self, name: str) -> dict[str, Any]:
        """Output values (secrets decrypted); empty when there is no such stack. One CLI call."""
        try:
            return dict(self._read_json(name, ["stack", "output", "--json", "--show-secrets"]) or {})
        except InvalidInputError as exc:
            if exc.reason == STACK_NOT_FOUND:
                return {}
            raise

    @_hosted
    def stack_tags(self, name: str) -> dict[str, str] | None:
        """The stack's tags (its owner among them); None when there is no such stack. One CLI call."""
        try:
            tags = self._read_json(name, ["stack", "tag", "ls", "--json"]) or {}
        except InvalidInputError as exc:
            if exc.reason == STACK_NOT_FOUND:
                return None
            raise
        return {key: str(value) for key, value in tags.items()}

    @_hosted
    def set_owner(self, name: str, installation: str) -> None:
        """Record `installation` as the stack's owner (a stack tag: kept by every backend)."""
        with self._operation(name, "tag", create=False) as (stack, _events):
            stack.set_tag(OWNER_TAG, installation)

    def applied_hash(self, name: str) -> str | None:
        """The spec hash of the last successful `up` (an output of the stack, so a restart finds it)."""
        value = self.plain_outputs(name).get(HASH_OUTPUT)
        return str(value) if value else None

    # --- plumbing -------------------------------------------------------------------------------------

    def _read_json(self, name: str, args: list[str]) -> Any:
        """A read of one stack as one CLI call, named by `--stack` (selecting it first, as the Automation
        API does, is a call of its own, and `outputs()` makes two: the backend read of a term makes these
        for every stack), its JSON output."""
        from pulumi import automation as auto

        try:
            result = self._run(self._workspace(name), [*args, "--stack", name])
        except auto.errors.CommandError as exc:
            raise translate(exc, stack=name) from exc
        return json.loads(result.stdout or "null")

    def _run(self, workspace: auto.Workspace, args: list[str]) -> auto.CommandResult:
        """One CLI call in the workspace, with the environment the SDK gives its own calls; the SDK's
        errors (a ConcurrentUpdateError for a held lock among them) as it raises them."""
        home = {"PULUMI_HOME": workspace.pulumi_home} if workspace.pulumi_home else {}
        return self._command.run(args, workspace.work_dir, {**home, **workspace.env_vars})

    def _import_state(self, name: str, stack: auto.Stack, state: dict[str, Any]) -> None:
        """`stack import` as the SDK's `import_stack` runs it, but its file is written in the operation's
        own folder (its TMPDIR, removed when the operation ends) and removed whatever the import did. The
        SDK's file went to the system's temporary folder and stayed there when the import failed (a held
        lock, a term that ended): the stack's whole state, its secrets decrypted (`export_stack` reads it
        with `--show-secrets`)."""
        workspace = stack.workspace
        folder = workspace.env_vars.get("TMPDIR")
        with tempfile.NamedTemporaryFile(
            "w", dir=folder, prefix="state-", suffix=".json", delete=False
        ) as file:
            json.dump(state, file)
        try:
            self._run(workspace, ["stack", "import", "--file", file.name, "--stack", name])
        finally:
            Path(file.name).unlink(missing_ok=True)

    @contextmanager
    def _operation(
        self, name: str, kind: str, *, create: bool = True, env: dict[str, str] | None = None
    ) -> Iterator[tuple[auto.Stack, Any]]:
        from pulumi import automation as auto

        events = EventLogger(stack=name, operation=kind, keep=kind.startswith("preview"))
        started = time.monotonic()
        # The CLI and its plugins keep their temporary files in a folder of this operation, removed when it
        # ends (and by a later process when this one was killed first: scratch.py): the Kubernetes plugin
        # writes a kubeconfig given as content (a kubeconfigSecret's) to $TMPDIR at each start and never
        # removes it (docs/security.md). The proxies a `local` stack starts have an environment of their
        # own (no TMPDIR).
        scratch_folder = operation_folder()
        try:
            workspace = self._workspace(name, {**(env or {}), "TMPDIR": scratch_folder})
            select = self._create_or_select if create else auto.Stack.select
            stack = select(name, workspace)
            yield stack, events
        except auto.errors.CommandError as exc:
            raise translate(exc, stack=name) from exc
        finally:
            shutil.rmtree(scratch_folder, ignore_errors=True)
            log.debug("%s %s took %.1fs", kind, name, time.monotonic() - started)

    def _create_or_select(self, name: str, workspace: auto.LocalWorkspace) -> auto.Stack:
        """Select the stack, or create it tagged with this installation as its owner."""
        from pulumi import automation as auto

        try:
            return auto.Stack.select(name, workspace)
        except auto.errors.StackNotFoundError:
            self._written.forget(name)  # whatever was written for a stack of that name before
            stack = auto.Stack.create(name, workspace)
        if self.config.installation:
            stack.set_tag(OWNER_TAG, self.config.installation)
        return stack

    def _retry_lock(self, stack: auto.Stack, operation: Callable[[], Any]) -> Any:
        """Run; on a lock whose owner is gone (a dead pid here, or a replica that `foreign_lock_gone` says is
        gone), recover it once and run again."""
        from pulumi import automation as auto

        try:
            return operation()
        except auto.errors.ConcurrentUpdateError as exc:
            if not self._locks.recover_if_stale(stack=stack, message=str(exc)):
                raise
        return operation()

    def _configure(self, stack: auto.Stack, spec: StackInput) -> None:
        from pulumi import automation as auto

        config = {
            f"{CONFIG_NAMESPACE}:provider": auto.ConfigValue(spec.provider_json),
            f"{CONFIG_NAMESPACE}:proxies": auto.ConfigValue(spec.proxies_json),
            f"{CONFIG_NAMESPACE}:credentials": auto.ConfigValue(spec.credentials_json, secret=True),
            f"{CONFIG_NAMESPACE}:specHash": auto.ConfigValue(spec.spec_hash),
            f"{CONFIG_NAMESPACE}:stack": auto.ConfigValue(spec.name),
            f"{CONFIG_NAMESPACE}:probeUrl": auto.ConfigValue(self.config.probe_url or ""),  # "": none
            f"{CONFIG_NAMESPACE}:probePods": auto.ConfigValue(self.config.probe_pods or ""),  # "": none
            # The resources' installation label (stacks/marks.py); "": none. Not in the spec hash: a stack
            # takes it at its next `up`.
            f"{CONFIG_NAMESPACE}:installation": auto.ConfigValue(self.config.installation or ""),
        }
        if spec.provider_credentials is not None:
            key = f"{CONFIG_NAMESPACE}:providerCredentials"
            config[key] = auto.ConfigValue(spec.provider_credentials, secret=True)
        digest = config_digest({key: (value.value, value.secret) for key, value in config.items()})
        work_dir = Path(stack.workspace.work_dir)
        if self._written.holds(stack=spec.name, term=self.term, config=digest, work_dir=work_dir):
            log.debug("config of %s: as this term last set it", spec.name)
            return
        stack.set_all_config(config)
        self._written.record(stack=spec.name, term=self.term, config=digest, work_dir=work_dir)

    @contextmanager
    def _forgotten_on_failure(self, name: str) -> Iterator[None]:
        """Forget what was written as `name`'s config when the block fails: the next operation on it sets
        its config again (automation/engine/config_cache.py)."""
        try:
            yield
        except BaseException:
            self._written.forget(name)
            raise

    def _workspace(self, name: str | None, env: dict[str, str] | None = None) -> auto.LocalWorkspace:
        from pulumi import automation as auto

        work_dir = self.config.state_dir / "work" / (name or "_list")
        work_dir.mkdir(parents=True, exist_ok=True)
        settings = auto.ProjectSettings(
            name=self.config.project_name,
            runtime="python",
            main=str(self.config.program_dir),
            backend=auto.ProjectBackend(url=self.config.backend_url),
        )
        write_project_file(work_dir, settings.to_dict())  # whole or not at all: operations can overlap
        return auto.LocalWorkspace(
            work_dir=str(work_dir),
            secrets_provider=self.config.secrets_provider,
            env_vars={**self.config.environment(), **(env or {})},
            pulumi_command=self._command,
            pulumi_home=str(self.config.pulumi_home) if self.config.pulumi_home else None,
        )


def _plain(outputs: dict[str, Any]) -> dict[str, Any]:
    return {key: value.value for key, value in outputs.items()}


def _drifted(event: Any) -> bool:
    """A drift check's event worth keeping: a step's outcome that changes something."""
    outcome = event.res_outputs_event
    return outcome is not None and str(outcome.metadata.op.value) not in UNCHANGING
