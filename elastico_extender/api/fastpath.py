"""The extender's hot verbs straight from the ASGI call to their handlers.

kube-scheduler calls filter and prioritize once per pod each, so the web
framework's own per-request work (route matching over every route, dependency
resolution, telemetry checks) is a measurable share of a 1 ms answer.  This
middleware hands a POST to one of those paths directly to the same endpoint
function the router would call, and renders an :class:`ApiError` the way the
app's exception handler does; everything else goes through the app as usual.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from elastico_extender.api.deps import ApiError, json_response

__all__ = ["DirectRoutes"]

Endpoint = Callable[[Request], Awaitable[Response]]


class DirectRoutes:
    """ASGI middleware: ``routes`` maps an exact path to the endpoint serving its POST."""

    def __init__(self, app: ASGIApp, routes: Mapping[str, Endpoint]) -> None:
        self.app = app
        self.routes = dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            response = await endpoint(Request(scope, receive))
        except ApiError as exc:
            response = json_response({"Error": exc.message}, exc.status, exc.headers)
        await response(scope, receive, send)
