"""Fetch pages through proxy-operator's proxies with the client package (docs/clients.md).

    pip install ./clients/python
    PROXY_OPERATOR_URL=http://127.0.0.1:8080 PROXY_OPERATOR_TOKEN=$(cat .state/dev-token) \
        python docs/clients/python_client.py https://example.com/ https://example.com/about

Each page is fetched once with the blocking client and once with the asyncio one: lease, fetch through the
proxy, report, release; a ban or a failing proxy is reported and the page tried through another proxy. Run
by tests/service/test_client_examples.py.
"""

from __future__ import annotations

import asyncio
import os
import sys
from urllib.parse import urlsplit

from proxy_operator_client import AsyncDiscoveryClient, DiscoveryClient, ProxyOperatorError


def fetch_all(api: str, token: str, urls: list[str]) -> None:
    with DiscoveryClient(api, token) as client:
        for url in urls:
            try:
                page = client.fetch(url, target=urlsplit(url).hostname or "*")
            except ProxyOperatorError as exc:  # refused by the egress policy, site down, or gave up
                print(f"{url}: {exc}")
                continue
            print(f"{url}: {page.status_code}, {len(page.content)} bytes")


async def fetch_all_at_once(api: str, token: str, urls: list[str]) -> None:
    async with AsyncDiscoveryClient(api, token) as client:
        pages = await asyncio.gather(
            *(client.fetch(url, target=urlsplit(url).hostname or "*") for url in urls), return_exceptions=True
        )
    for url, page in zip(urls, pages, strict=True):
        print(f"{url}: {page if isinstance(page, Exception) else page.status_code} (async)")


if __name__ == "__main__":
    api, token = os.environ["PROXY_OPERATOR_URL"], os.environ["PROXY_OPERATOR_TOKEN"]
    fetch_all(api, token, sys.argv[1:])
    asyncio.run(fetch_all_at_once(api, token, sys.argv[1:]))
