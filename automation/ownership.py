"""Which stacks of a backend this installation may touch.

A stack carries the owner tag (`proxy-operator:installation`) from its creation. The rule, applied before any
operation on an existing stack (`up` as well as `destroy` and state edits):

- tagged with our installation: ours;
- tagged with another one: foreign, left alone with a warning (two installations may share a backend, and a
  catalogue entry of the same name gives the same stack name);
- untagged (made before ownership was recorded, or by an `up` interrupted right after creating it): adopted
  once, with a log line, if our catalogue has an entry of that name; otherwise left alone.
"""

from __future__ import annotations

from enum import StrEnum

from automation.engine import OWNER_TAG


class Ownership(StrEnum):
    NEW = "new"  # no such stack yet: the engine tags it when it creates it
    OURS = "ours"
    ADOPT = "adopt"
    FOREIGN = "foreign"
    UNCLAIMED = "unclaimed"  # untagged, and no catalogue entry of ours names it


def ownership(tags: dict[str, str] | None, *, installation: str, in_catalogue: bool) -> Ownership:
    if tags is None:
        return Ownership.NEW
    owner = tags.get(OWNER_TAG)
    if owner == installation:
        return Ownership.OURS
    if owner:
        return Ownership.FOREIGN
    return Ownership.ADOPT if in_catalogue else Ownership.UNCLAIMED


def not_owned_message(name: str, tags: dict[str, str] | None, *, installation: str) -> str:
    owner = (tags or {}).get(OWNER_TAG)
    if owner:
        return (
            f"stack {name} belongs to installation '{owner}', not to this one ('{installation}'): it is left "
            f"alone; give each installation its own backend or catalogue entry names, or set "
            f"PROXY_OPERATOR_INSTALLATION={owner} on the installation that should manage it"
        )
    return (
        f"stack {name} has no owner tag and no catalogue entry of this installation names it: it is left "
        f"alone; to manage it here, add a catalogue entry named {name}"
    )
