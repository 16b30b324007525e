"""The FastAPI app: probes, echo, proxies, leases, reports and stacks, one router per resource."""

from service.api.app import ApiContext, create_app

__all__ = ["ApiContext", "create_app"]
