"""The integration's settings, read once from the crawler's (docs/clients.md, "Scrapy settings")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scrapy.http import Response
from scrapy.settings import BaseSettings
from scrapy.utils.misc import load_object

from proxy_operator_client.backoff import Backoff
from proxy_operator_client.errors import ProxyOperatorError
from proxy_operator_client.judge import BAN_CODES

HANDLERS = "PROXY_OPERATOR_DOWNLOAD_HANDLERS"  # the handlers the wrapper sends through, per scheme
DEFAULT_HANDLER = "scrapy.core.downloader.handlers.http11.HTTP11DownloadHandler"


@dataclass(frozen=True)
class Settings:
    url: str
    token: str
    filters: dict[str, Any]  # pool, provider, labels; protocol is always http (Scrapy speaks HTTP proxies)
    ttl: float = 60.0  # a lease's lifetime; renewed while a download lasts longer
    renew: bool = True
    wait: float = 0.0  # the API's `wait`: held in the downloader, so kept short
    concurrency_per_site: int = 0  # most leases at once per site (0: Scrapy's slot concurrency alone)
    ban_codes: frozenset[int] = BAN_CODES
    ban_check: Callable[[Response], bool] | None = None
    max_retries: int | None = None  # None: Scrapy's RETRY_TIMES (or the request's max_retry_times)
    backoff: Backoff = field(default_factory=Backoff)
    api_timeout: float = 5.0
    close_timeout: float = 0.5  # what the close gives reports and releases still to send

    @classmethod
    def from_scrapy(cls, settings: BaseSettings) -> Settings:
        url, token = settings.get("PROXY_OPERATOR_URL"), settings.get("PROXY_OPERATOR_TOKEN")
        if not url or not token:
            raise ProxyOperatorError(
                "set PROXY_OPERATOR_URL and PROXY_OPERATOR_TOKEN (or PROXY_OPERATOR_ENABLED)"
            )
        check = settings.get("PROXY_OPERATOR_BAN_CHECK")
        filters = {
            "pool": settings.get("PROXY_OPERATOR_POOL"),
            "provider": settings.get("PROXY_OPERATOR_PROVIDER"),
            "labels": settings.getdict("PROXY_OPERATOR_LABELS") or None,
            "protocol": "http",
        }
        retries = settings.get("PROXY_OPERATOR_MAX_RETRIES")
        return cls(
            url=url,
            token=token,
            filters={name: value for name, value in filters.items() if value is not None},
            ttl=settings.getfloat("PROXY_OPERATOR_TTL", 60.0),
            renew=settings.getbool("PROXY_OPERATOR_RENEW", True),
            wait=settings.getfloat("PROXY_OPERATOR_WAIT", 0.0),
            concurrency_per_site=settings.getint("PROXY_OPERATOR_CONCURRENCY_PER_SITE", 0),
            ban_codes=frozenset(
                int(code) for code in settings.getlist("PROXY_OPERATOR_BAN_CODES", [403, 429])
            ),
            ban_check=load_object(check) if check else None,
            max_retries=None if retries is None else int(retries),
            backoff=Backoff(
                base=settings.getfloat("PROXY_OPERATOR_BACKOFF_BASE", 0.5),
                cap=settings.getfloat("PROXY_OPERATOR_BACKOFF_CAP", 8.0),
            ),
            api_timeout=settings.getfloat("PROXY_OPERATOR_API_TIMEOUT", 5.0),
            close_timeout=settings.getfloat("PROXY_OPERATOR_CLOSE_TIMEOUT", 0.5),
        )
