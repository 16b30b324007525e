"""The Scrapy integration (the `scrapy` extra): one add-on that installs a downloader middleware and a
download-handler wrapper. The handler leases a proxy for each request at the moment Scrapy sends it (after
the site's DOWNLOAD_DELAY, so the lease cannot expire first), reports and releases it as the answer comes;
the middleware retries bans and failing proxies with Scrapy's retry machinery and parks the requests that
cannot have a proxy yet outside the downloader, so a banned site never holds Scrapy's concurrency.

    ADDONS = {"proxy_operator_client.scrapy.ProxyOperatorAddon": 500}
    PROXY_OPERATOR_URL = "http://proxy-operator.crawl.svc:8080"
    PROXY_OPERATOR_TOKEN = "..."

docs/clients.md ("Scrapy") tells the settings, the outcomes, the stats and the design.
"""

try:
    import scrapy  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "proxy_operator_client.scrapy needs Scrapy: pip install 'proxy-operator-client[scrapy]'"
    ) from exc

from proxy_operator_client.scrapy.addon import ProxyOperatorAddon
from proxy_operator_client.scrapy.handler import ProxyOperatorDownloadHandler
from proxy_operator_client.scrapy.meta import LEASE_META, SESSION_META, USE_META
from proxy_operator_client.scrapy.middleware import ProxyOperatorMiddleware

__all__ = [
    "LEASE_META",
    "SESSION_META",
    "USE_META",
    "ProxyOperatorAddon",
    "ProxyOperatorDownloadHandler",
    "ProxyOperatorMiddleware",
]
