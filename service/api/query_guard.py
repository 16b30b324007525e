"""Unknown query parameters are refused (422 naming them), as unknown body fields are: a typo such as
`?healty=true` must not pass silently and answer as if no filter had been given."""

from __future__ import annotations

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from service.api.errors import ApiError

# id(route) -> (route, names): routes are not hashable; the identity check guards against a reused id
_DECLARED: dict[int, tuple[APIRoute, frozenset[str]]] = {}


def declared(route: APIRoute) -> frozenset[str]:
    """The query parameters a route (with its dependencies) declares, by the name a client sends."""
    known = _DECLARED.get(id(route))
    if known is None or known[0] is not route:
        known = _DECLARED[id(route)] = (route, frozenset(_query_names(route.dependant)))
    return known[1]


def _query_names(dependant: Dependant) -> set[str]:
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


async def refuse_unknown_query(request: Request) -> None:
    """A router dependency: costs nothing for a request without a query string."""
    if not request.scope.get("query_string"):
        return
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    allowed = declared(route)
    unknown = sorted(set(request.query_params) - allowed)
    if unknown:
        takes = ", ".join(sorted(allowed)) or "none"
        message = f"unknown query parameter (this route takes: {takes})"
        raise ApiError(422, "invalid_request", [{"field": f"query.{n}", "message": message} for n in unknown])
