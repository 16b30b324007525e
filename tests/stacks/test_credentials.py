"""The dynamic providers behind GeneratedCredentials and StableSuffix: drawn once, then never changed."""

from __future__ import annotations

import itertools

from stacks.programs.credentials import (
    ALPHABET,
    PASSWORD_LENGTH,
    USERNAME_LENGTH,
    CredentialsProvider,
    SuffixProvider,
)
from stacks.programs.proxy_config import SAFE_CREDENTIAL


def _counting_token() -> object:
    counter = itertools.count()
    return lambda length: "".join(ALPHABET[(next(counter) * 7) % len(ALPHABET)] for _ in range(length))


def test_create_draws_credentials_that_every_proxy_config_accepts() -> None:
    created = CredentialsProvider().create({"keeper": "", "username": None, "password": None})
    username, password = created.outs["username"], created.outs["password"]

    assert len(username) == USERNAME_LENGTH
    assert len(password) == PASSWORD_LENGTH
    assert SAFE_CREDENTIAL.fullmatch(username)
    assert SAFE_CREDENTIAL.fullmatch(password)
    assert username == username.lower()


def test_the_token_source_is_injected() -> None:
    provider = CredentialsProvider(token=_counting_token())  # type: ignore[arg-type]
    replay = CredentialsProvider(token=_counting_token())  # type: ignore[arg-type]
    first = provider.create({"keeper": ""}).outs

    assert replay.create({"keeper": ""}).outs == first  # same source, same draw: randomness is injected
    assert provider.create({"keeper": ""}).outs != first


def test_values_stay_until_the_keeper_changes() -> None:
    provider = CredentialsProvider()
    olds = provider.create({"keeper": "v1", "username": None, "password": None}).outs
    news = {"keeper": "v1", "username": None, "password": None}

    assert provider.diff("id", olds, news).changes is False
    assert provider.read("id", olds).outs == olds
    changed = provider.diff("id", olds, {**news, "keeper": "v2"})
    assert changed.changes is True
    assert changed.replaces == ["keeper"]


def test_suffix_is_short_and_lowercase() -> None:
    suffix = SuffixProvider().create({"keeper": "", "length": 6, "suffix": None}).outs["suffix"]

    assert len(suffix) == 6
    assert suffix == suffix.lower()
    assert suffix.isalnum()
