"""Packages whose `__init__` runs only when a name only it defines is asked for (issue 20, memory).

The `kubernetes` package's `__init__` imports every feature of the client: the dynamic client, the
websocket-client streams, the informers, leader election, and (through `kubernetes.config`'s `__init__`) the
kubeconfig loader, which imports requests, requests-oauthlib, oauthlib and google-auth at its top. The
service uses the API client (`kubernetes.client`, whose models load lazily) and, in a pod, the in-cluster
loader (`kubernetes.config.incluster_config`): about 6.5 MiB of RSS on every replica went to the rest.

`defer_init(name)` puts the package in `sys.modules` as its spec makes it (`__path__`, `__spec__`,
`__file__`), without running its `__init__`: `import kubernetes.client` then imports the submodule alone.
A submodule asked for as an attribute (`kubernetes.watch`, `from kubernetes import watch`) is imported
alone. The first time anyone asks the package for any other name it does not have yet
(`kubernetes.config.load_kube_config`, `kubernetes.__version__`), the `__init__` runs into the same module
object and the name is looked up again, so code written against the whole package still gets it.
Submodules already imported stay as they are (the `__init__`'s `from . import client` finds them). It
does nothing to a package already imported, and nothing when the package is not installed.

Called from `service/__init__.py`, before any of the service's modules imports `kubernetes`. The program
processes the engine starts (`stacks/programs`) are other interpreters and import the packages whole.
`tests/service/test_lean_packages.py` and the follower's import test (`tests/service/follower_modules.py`)
keep it so.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from typing import Any

__all__ = ["DEFERRED", "defer_init", "defer_service_packages", "initialised"]

# Outermost first: a subpackage's parent must be in sys.modules before it.
DEFERRED = ("kubernetes", "kubernetes.config")

_lock = threading.RLock()  # re-entrant: the __init__ itself asks the module for its submodules


def defer_init(name: str) -> bool:
    """Put package `name` in sys.modules without running its `__init__` (run on the first miss).
    False when it is imported already or not installed (nothing done)."""
    with _lock:
        if name in sys.modules:
            return False
        parent, _, child = name.rpartition(".")
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return False
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            return False  # not installed, or not a package
        module = importlib.util.module_from_spec(spec)
        state = {"done": False, "running": False}

        def complete(attr: str) -> Any:  # PEP 562: called only for a name the module does not have
            if not state["done"] and importlib.util.find_spec(f"{name}.{attr}") is not None:
                return importlib.import_module(f"{name}.{attr}")  # a submodule: imported alone
            with _lock:
                if not state["done"] and not state["running"]:
                    state["running"] = True
                    try:
                        assert spec.loader is not None
                        spec.loader.exec_module(module)
                        state["done"] = True
                    finally:
                        state["running"] = False
                if attr in module.__dict__:  # run now, or by another thread while this one waited
                    return module.__dict__[attr]
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")

        module.__getattr__ = complete  # type: ignore[method-assign]
        module.__dict__["_deferred_init_state"] = state
        sys.modules[name] = module
        if parent:
            setattr(sys.modules[parent], child, module)
        return True


def initialised(name: str) -> bool:
    """Whether the package's `__init__` has run (True for a package imported the ordinary way)."""
    module = sys.modules.get(name)
    if not isinstance(module, types.ModuleType):
        return False
    state = module.__dict__.get("_deferred_init_state")
    return state is None or bool(state["done"])


def defer_service_packages() -> None:
    for name in DEFERRED:
        defer_init(name)
