"""Clients of the proxy-operator discovery API (docs/api.md, docs/clients.md).

    from proxy_operator_client import DiscoveryClient
    with DiscoveryClient("http://127.0.0.1:8080", token) as client:
        page = client.fetch("https://example.com/", target="example.com")

`AsyncDiscoveryClient` behaves the same with `await`. The Scrapy integration is
`proxy_operator_client.scrapy` (the `scrapy` extra).
"""

from proxy_operator_client.aio import AsyncDiscoveryClient
from proxy_operator_client.errors import (
    ApiError,
    ApiUnavailable,
    NoGoodAnswer,
    NoProxyAvailable,
    ProxyAnswer,
    ProxyOperatorError,
    Refused,
    SiteDown,
)
from proxy_operator_client.judge import Outcome
from proxy_operator_client.sync import DiscoveryClient
from proxy_operator_client.wire import Lease

__version__ = "1.0.0"  # the major version is the API version it speaks
API_VERSION = "v1"

__all__ = [
    "API_VERSION",
    "ApiError",
    "ApiUnavailable",
    "AsyncDiscoveryClient",
    "DiscoveryClient",
    "Lease",
    "NoGoodAnswer",
    "NoProxyAvailable",
    "Outcome",
    "ProxyAnswer",
    "ProxyOperatorError",
    "Refused",
    "SiteDown",
    "__version__",
]
