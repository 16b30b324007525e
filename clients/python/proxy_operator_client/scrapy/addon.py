"""The add-on: one line in ADDONS installs the middleware and puts the leasing handler in front of the
http and https handlers configured so far (remembered in PROXY_OPERATOR_DOWNLOAD_HANDLERS)."""

from __future__ import annotations

from scrapy.settings import BaseSettings
from scrapy.utils.misc import load_object

from proxy_operator_client.scrapy.handler import ProxyOperatorDownloadHandler
from proxy_operator_client.scrapy.middleware import ProxyOperatorMiddleware
from proxy_operator_client.scrapy.settings import HANDLERS

MIDDLEWARE_PRIORITY = 610  # after RedirectMiddleware (600), before HttpProxyMiddleware (750)
HANDLER = f"{ProxyOperatorDownloadHandler.__module__}.{ProxyOperatorDownloadHandler.__qualname__}"


class ProxyOperatorAddon:
    def update_settings(self, settings: BaseSettings) -> None:
        settings.set_in_component_priority_dict(
            "DOWNLOADER_MIDDLEWARES", ProxyOperatorMiddleware, MIDDLEWARE_PRIORITY
        )
        current = settings.getwithbase("DOWNLOAD_HANDLERS")
        wrapped = {
            scheme: current[scheme]
            for scheme in ("http", "https")
            if current.get(scheme) is not None
            and load_object(current[scheme]) is not ProxyOperatorDownloadHandler
        }
        settings.set(HANDLERS, {**wrapped, **settings.getdict(HANDLERS)}, "addon")
        handlers = {**settings.getdict("DOWNLOAD_HANDLERS"), **{scheme: HANDLER for scheme in wrapped}}
        # At the priority the setting has, like set_in_component_priority_dict: a project's own
        # DOWNLOAD_HANDLERS would otherwise win over an add-on's.
        settings.set("DOWNLOAD_HANDLERS", handlers, settings.getpriority("DOWNLOAD_HANDLERS") or 0)
