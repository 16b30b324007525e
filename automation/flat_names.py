"""Which Proxies share a flat physical name (`<namespace>-<name>`): the planner's index of them.

Almost every flat name belongs to one Proxy, so a group of one is kept as that key alone (a set costs
216 bytes, and a leader indexes 10,000 names); a set is made only when a second Proxy comes.
"""

from __future__ import annotations

__all__ = ["FlatNameGroups"]


class FlatNameGroups:
    __slots__ = ("_groups",)

    def __init__(self) -> None:
        self._groups: dict[str, str | set[str]] = {}

    def add(self, flat: str, key: str) -> None:
        group = self._groups.get(flat)
        if group is None or group == key:
            self._groups[flat] = key
        elif isinstance(group, str):
            self._groups[flat] = {group, key}
        else:
            group.add(key)

    def discard(self, flat: str, key: str) -> None:
        """Forget `key` in its group; a group left with one key is kept as that key, an empty one dropped."""
        group = self._groups.get(flat)
        if group is None:
            return
        if isinstance(group, str):
            if group == key:
                del self._groups[flat]
            return
        group.discard(key)
        if len(group) == 1:
            self._groups[flat] = next(iter(group))
        elif not group:
            del self._groups[flat]

    def get(self, flat: str) -> set[str]:
        """The keys of the Proxies with that flat name (a copy: empty when none)."""
        group = self._groups.get(flat)
        if group is None:
            return set()
        return {group} if isinstance(group, str) else set(group)

    def __contains__(self, flat: str) -> bool:
        return flat in self._groups
