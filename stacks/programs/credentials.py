"""Random values made once and kept in the stack state: generated proxy credentials, and name suffixes.

Dynamic resources (run by `python -m pulumi.dynamic`), so a value is drawn at create and then read back from
state on every later `up`: credentials stay stable until the resource is replaced. The classes live in this
importable module because the provider process unpickles them by reference.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider

from stacks.programs import dynamic_pickling

# Letters and digits only: safe in a pproxy URI, a tinyproxy BasicAuth line, a 3proxy users line and a shell
# heredoc, so generated credentials never need quoting anywhere.
ALPHABET = string.ascii_letters + string.digits
USERNAME_LENGTH = 12
PASSWORD_LENGTH = 32

TokenSource = Callable[[int], str]


def random_token(length: int) -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(length))


class _StableRandomProvider(ResourceProvider):
    """Draws values at create; never changes them afterwards (diff reports no change)."""

    def __init__(self, token: TokenSource = random_token) -> None:
        super().__init__()
        self._token = token

    def draw(self, props: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = {**props, **self.draw(props)}
        return CreateResult(id_=self._token(16), outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # Only an explicit `keeper` change replaces (and so re-draws); everything else keeps the values.
        changed = olds.get("keeper") != news.get("keeper")
        return DiffResult(
            changes=changed, replaces=["keeper"] if changed else [], delete_before_replace=False
        )

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return ReadResult(id_=id_, outs=props)


class CredentialsProvider(_StableRandomProvider):
    def draw(self, props: dict[str, Any]) -> dict[str, Any]:
        return {
            "username": "u" + self._token(USERNAME_LENGTH - 1).lower(),
            "password": self._token(PASSWORD_LENGTH),
        }


class SuffixProvider(_StableRandomProvider):
    def draw(self, props: dict[str, Any]) -> dict[str, Any]:
        return {"suffix": self._token(int(props.get("length", 6))).lower()}


class GeneratedCredentials(Resource, module="proxy-operator", name="GeneratedCredentials"):
    """A username and password drawn once with `secrets`; both outputs are secret."""

    username: pulumi.Output[str]
    password: pulumi.Output[str]

    def __init__(self, name: str, *, keeper: str = "", opts: pulumi.ResourceOptions | None = None) -> None:
        secret_opts = pulumi.ResourceOptions(additional_secret_outputs=["username", "password"])
        super().__init__(
            CredentialsProvider(),
            name,
            {"keeper": keeper, "username": None, "password": None},
            pulumi.ResourceOptions.merge(opts, secret_opts),
        )
        dynamic_pickling.unstack()


class StableSuffix(Resource, module="proxy-operator", name="StableSuffix"):
    """A short lowercase random suffix, drawn once; used to give retained cache volumes fresh names."""

    suffix: pulumi.Output[str]

    def __init__(
        self, name: str, *, keeper: str = "", length: int = 6, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(SuffixProvider(), name, {"keeper": keeper, "length": length, "suffix": None}, opts)
        dynamic_pickling.unstack()
