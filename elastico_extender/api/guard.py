"""The last line of the edge: an exception no handler expected becomes a plain JSON 500.

Starlette answers an unhandled exception with a 500 and then re-raises it, and
uvicorn closes the connection of a request whose exception escaped after the reply
started: the scheduler's next request on that keep-alive connection fails.  This
middleware sits inside Starlette's error middleware, logs the exception with its
traceback, answers ``{"Error": "elastico internal error ...; see the extender log"}``
(no exception name or message: those are Python internals) and lets nothing escape.
Bad input never gets here: it is a 4xx where the request is read (api.validate).
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from elastico_extender.api.deps import json_response

__all__ = ["CatchAll"]

log = logging.getLogger(__name__)


class CatchAll:
    """ASGI middleware: unhandled exceptions -> logged, JSON 500, connection kept."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            log.exception("request.failed", extra={"path": scope.get("path")})
            if started:  # half a reply is on the wire: nothing valid can follow it
                raise
            message = f"elastico internal error in {scope.get('path')}; see the extender log"
            await json_response({"Error": message}, 500)(scope, receive, send)
