"""The Pulumi engine: the only package that imports `pulumi.automation`."""

from automation.engine.config import (
    APPLIED_PROXIES_OUTPUT,
    CREDENTIALS_OUTPUT,
    HASH_OUTPUT,
    OWNER_TAG,
    EngineConfig,
    StackInput,
)
from automation.engine.core import Engine
from automation.engine.results import OperationResult, PreviewStep, StackInfo
from automation.engine.term import Term, TermEndedError

__all__ = [
    "APPLIED_PROXIES_OUTPUT",
    "CREDENTIALS_OUTPUT",
    "HASH_OUTPUT",
    "OWNER_TAG",
    "Engine",
    "EngineConfig",
    "OperationResult",
    "PreviewStep",
    "StackInfo",
    "StackInput",
    "Term",
    "TermEndedError",
]
