"""service/lean_packages.py: a package whose __init__ runs only when a name only it defines is asked for.

Each test makes a real package on disk (a unique name on sys.path) whose __init__ imports a "heavy"
submodule and records that it ran; the package is removed from sys.modules afterwards. The service's own use
(kubernetes, in a fresh interpreter) is checked in test_lazy_imports.py and tests/kube/test_follower.py.
"""

from __future__ import annotations

import builtins
import importlib
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.lean_packages import defer_init, initialised

INIT = """\
from . import heavy
from . import light
import builtins
builtins.__dict__.setdefault("lean_runs", []).append(__name__)
__version__ = "1.0"
def feature():
    return heavy.NAME
"""


@pytest.fixture
def package(tmp_path: Path) -> Iterator[str]:
    name = f"leanpkg_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text(INIT)
    (root / "heavy.py").write_text("NAME = 'heavy'\n")
    (root / "light.py").write_text("import sys\nVALUE = 1\n")
    (root / "other.py").write_text("VALUE = 2\n")
    (root / "sub" / "__init__.py").write_text("from . import inner\nSUB = True\n")
    (root / "sub" / "inner.py").write_text("INNER = 3\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield name
    finally:
        sys.path.remove(str(tmp_path))
        for loaded in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[loaded]
        builtins.__dict__.pop("lean_runs", None)


def runs() -> list[str]:
    return list(builtins.__dict__.get("lean_runs", []))


def test_a_submodule_is_imported_without_the_package_init(package: str) -> None:
    assert defer_init(package)
    light = importlib.import_module(f"{package}.light")
    assert light.VALUE == 1
    assert runs() == []
    assert f"{package}.heavy" not in sys.modules
    assert not initialised(package)


def test_a_name_only_the_init_defines_runs_it_once_into_the_same_module(package: str) -> None:
    assert defer_init(package)
    module = sys.modules[package]
    importlib.import_module(f"{package}.light")
    assert module.feature() == "heavy"  # the miss runs __init__, then the name is found
    assert module.__version__ == "1.0"
    assert sys.modules[package] is module
    assert runs() == [package]  # once, although the init asked the module for its submodules
    assert initialised(package)
    assert f"{package}.heavy" in sys.modules


def test_submodules_asked_as_attributes_or_from_imports_are_imported_alone(package: str) -> None:
    assert defer_init(package)
    module = sys.modules[package]
    assert module.other.VALUE == 2  # an attribute that is a submodule: imported, no init
    namespace: dict[str, object] = {}
    exec(f"from {package} import light", namespace)  # the import system asks hasattr() first
    assert namespace["light"] is sys.modules[f"{package}.light"]
    assert runs() == []


def test_a_name_missing_after_the_init_is_an_attribute_error(package: str) -> None:
    assert defer_init(package)
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = sys.modules[package].no_such_name
    assert runs() == [package]
    with pytest.raises(AttributeError):  # and again, without running the init a second time
        _ = sys.modules[package].no_such_name
    assert runs() == [package]


def test_a_deferred_subpackage_under_a_deferred_package(package: str) -> None:
    assert defer_init(package)
    assert defer_init(f"{package}.sub")
    inner = importlib.import_module(f"{package}.sub.inner")
    assert inner.INNER == 3
    sub = sys.modules[f"{package}.sub"]
    assert sys.modules[package].sub is sub
    assert not initialised(f"{package}.sub")
    assert sub.SUB is True  # the subpackage's own init, on its first miss
    assert runs() == []  # the parent's did not run for it


def test_nothing_is_done_to_an_imported_package_a_module_or_a_missing_one(package: str) -> None:
    importlib.import_module(package)
    assert runs() == [package]
    assert not defer_init(package)
    assert initialised(package)
    assert not defer_init("json.decoder")  # a module, not a package (json itself imported)
    assert not defer_init("no_such_package_here")
    assert "no_such_package_here" not in sys.modules


def test_threads_asking_at_once_run_the_init_once(package: str) -> None:
    assert defer_init(package)
    module = sys.modules[package]
    barrier = threading.Barrier(8)
    seen: list[str] = []

    def ask() -> None:
        barrier.wait()
        seen.append(module.feature())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == ["heavy"] * 8
    assert runs() == [package]
