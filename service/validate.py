"""`proxy-operator validate`: check a directory of manifests (Proxies + one catalogue) as a whole."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service.pools.validate import pool_problems
from stacks.manifests import load_manifests
from stacks.problems import Problem
from stacks.validation import check_manifests


@dataclass(frozen=True)
class ValidationReport:
    directory: str
    problems: list[Problem]
    proxies: int
    providers: int
    ignored: int
    pools: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        ignored = f", {_count(self.ignored, 'other document')} ignored" if self.ignored else ""
        state = "valid" if self.ok else _count(len(self.problems), "problem")
        counts = f"{_count(self.proxies, 'Proxy', 'Proxies')}, {_count(self.providers, 'provider')}"
        if self.pools:
            counts += f", {_count(self.pools, 'ProxyPool')}"
        return f"{self.directory}: {counts}: {state}{ignored}"


def _count(number: int, one: str, many: str | None = None) -> str:
    return f"{number} {one if number == 1 else many or one + 's'}"


def validate_manifests(directory: Path) -> ValidationReport:
    """Every problem in `directory`: file, object, field path, and what to do."""
    if not directory.is_dir():
        problem = Problem(
            file=str(directory),
            document=None,
            line=None,
            obj="directory",
            path="",
            message="is not a directory: pass the folder that holds the manifests",
        )
        return ValidationReport(str(directory), [problem], proxies=0, providers=0, ignored=0)
    manifests = load_manifests(directory)
    catalogue = manifests.catalogue
    return ValidationReport(
        directory=str(directory),
        problems=check_manifests(manifests) + pool_problems(manifests),
        proxies=len(manifests.proxies),
        pools=len(manifests.pools),
        providers=len(catalogue.providers) if catalogue else 0,
        ignored=len(manifests.ignored),
    )
