"""How the program reads its stack config: bad input is a permanent `InvalidInputError` naming the proxy.

Runs under `pulumi.runtime.set_mocks` (fresh per test) so no process or cloud resource is made.
"""

from __future__ import annotations

import pytest
from pulumi.runtime import rpc

from stacks.models import LocalProvider
from stacks.programs.component import InvalidInputError, ProgramProxy
from stacks.programs.context import MissingCredentialsError, ProgramSettings
from tests.stacks.program_harness import RecordingMocks, install, proxy, run

ENTRY = LocalProvider(name="local", type="local", stateDir="/tmp/unused")
SETTINGS = ProgramSettings(stack="local", root_dir="/tmp")
SECRET_AUTH = {"mode": "secret", "secretRef": {"name": "alpha-auth"}}


@pytest.fixture
def mocks() -> RecordingMocks:
    recording = RecordingMocks()
    install(recording, stack="local")
    return recording


def test_a_bad_spec_names_the_proxy_and_reads_as_invalid_input() -> None:
    item = {"namespace": "crawl", "name": "alpha", "spec": {"provider": "local", "port": 70000}}
    with pytest.raises(InvalidInputError, match=r"(?s)crawl/alpha: invalid spec .*port"):
        ProgramProxy.from_config(item)


def test_secret_mode_without_given_credentials_is_refused(mocks: RecordingMocks) -> None:
    with pytest.raises(MissingCredentialsError, match=r"crawl/alpha: auth\.mode is 'secret'"):
        run(entry=ENTRY, proxies=[proxy("alpha", provider="local", auth=SECRET_AUTH)], settings=SETTINGS)


def test_secret_mode_credentials_reach_the_output_and_the_process(mocks: RecordingMocks) -> None:
    given = {"crawl/alpha": {"username": "crawler", "password": "s3cret"}}
    outputs = run(
        entry=ENTRY,
        proxies=[proxy("alpha", provider="local", port=3130, auth=SECRET_AUTH)],
        settings=SETTINGS,
        credentials=given,
    )
    [process] = mocks.of_type("pulumi-python:dynamic/proxy-operator:LocalProxy")

    assert outputs["credentials"] == given
    assert process.inputs["port"] == 3130
    # Secret-mode credentials travel as Pulumi secrets all the way into the process resource.
    assert process.inputs["username"] == {rpc._special_sig_key: rpc._special_secret_sig, "value": "crawler"}
    assert outputs["proxies"]["crawl/alpha"]["host"] == "127.0.0.1"


def test_auth_none_exports_no_credentials(mocks: RecordingMocks) -> None:
    spec = {"provider": "local", "auth": {"mode": "none"}, "allowedSourceRanges": ["127.0.0.1/32"]}
    outputs = run(entry=ENTRY, proxies=[proxy("alpha", **spec)], settings=SETTINGS)
    [process] = mocks.of_type("pulumi-python:dynamic/proxy-operator:LocalProxy")

    assert outputs["credentials"] == {}
    assert process.inputs.get("username") is None
