"""A workaround for the Pulumi SDK's provider serialization (3.260.0, `pulumi/dynamic/dynamic.py`
`serialize_provider`): each dynamic resource wraps `pickle._Pickler._batch_setitems` in one more sorting
wrapper around the previous one and never puts it back, so after about 1,000 dynamic resources in one
program every pickle recurses past Python's limit (`RecursionError`: a 1,000-proxy `local` stack failed so,
docs/operations.md). `unstack()` after each dynamic resource puts the original back, so each serialization
adds one wrapper to the original: the same sorted, deterministic pickle, at depth one."""

from __future__ import annotations

import pickle

ORIGINAL = pickle._Pickler._batch_setitems  # type: ignore[attr-defined]  # before any resource of ours


def unstack() -> None:
    pickle._Pickler._batch_setitems = ORIGINAL  # type: ignore[attr-defined]
