"""Property-based run of the OpenAPI schema (schemathesis): no 500, no response outside the schema.

Bounded: a few examples per operation (a few hundred requests in all). In-process through ASGI, with a token
that holds every scope so the generated requests reach the handlers and not only the auth check.
"""

from __future__ import annotations

import random

import schemathesis
from hypothesis import HealthCheck, settings

from service.api import create_app
from service.auth import TokenAuthenticator, TokenEntry, hash_token
from service.discovery.memory import MemoryStore
from service.discovery.service import DiscoveryService
from service.settings import DiscoverySettings
from tests.service.conftest import healthy_inventory
from tests.service.test_api_routes import FakeStackInspector

TOKEN = "schema-token"


def _schema() -> schemathesis.BaseSchema:
    inventory = healthy_inventory(["a", "b", "c"])
    discovery = DiscoveryService(
        inventory=inventory,
        store=MemoryStore(),
        settings=DiscoverySettings(max_wait_seconds=0),
        rng=random.Random(1),
    )
    entry = TokenEntry(name="root", scopes={"lease", "report", "admin"}, sha256=hash_token(TOKEN))
    app = create_app(
        inventory=inventory,
        discovery=discovery,
        authenticator=TokenAuthenticator([entry]),
        stack_inspector=FakeStackInspector(),
    )
    return schemathesis.openapi.from_asgi("/openapi.json", app)


schema = _schema()


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_no_500_and_every_response_fits_the_schema(case: schemathesis.Case) -> None:
    case.call_and_validate(
        headers={"Authorization": f"Bearer {TOKEN}"},
        # 503 is a declared answer here. The two data checks are off: FastAPI is lenient on purpose (a
        # repeated query parameter takes the last value), and cross-field rules (a session leases one proxy;
        # a report names a lease or a proxy) are 422s that JSON Schema cannot express: tested elsewhere.
        excluded_checks=[
            schemathesis.checks.not_a_server_error,
            schemathesis.checks.negative_data_rejection,
            schemathesis.checks.positive_data_acceptance,
        ],
        additional_checks=[no_internal_error],
    )


def no_internal_error(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool:
    """Any 5xx other than the declared 503 (nothing eligible, not ready) is a bug."""
    if response.status_code >= 500 and response.status_code != 503:
        raise AssertionError(
            f"{case.method} {case.formatted_path} answered {response.status_code}: {response.text}"
        )
    return True
