"""Shared pieces of the HTTP edge: request bodies with limits, JSON replies, auth."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from elastico_extender.bearer import BearerToken
from elastico_extender.service.agent_auth import (
    RETRY_AFTER_SECONDS,
    AgentAuthenticator,
    AgentRefused,
)
from elastico_extender.service.engine import Engine
from elastico_extender.service.metrics import PrometheusMetrics
from elastico_extender.service.settings import ServiceSettings
from elastico_extender.service.views import to_json

__all__ = [
    "ApiError",
    "engine_of",
    "json_response",
    "metrics_of",
    "read_model",
    "require_auth",
    "settings_of",
    "timed_view",
    "timed_view_off_loop",
]

M = TypeVar("M", bound=BaseModel)
INLINE_PARSE_BYTES = 256 << 10
"""Largest body parsed on the event loop (a few ms); a larger one (a filter carrying
thousands of Node objects, nodeCacheCapable off) is parsed in a worker thread, so other
requests, the health probes among them, are not held behind it."""


class ApiError(Exception):
    """A client error: rendered as ``{"Error": message}`` with ``status`` (4xx)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def json_response(
    content: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        to_json(content), status_code=status, media_type="application/json", headers=headers
    )


def timed_view(request: Request, verb: str, view: Callable[[], bytes]) -> Response:
    """Serve one read-only view, JSON already (``view`` returns its bytes), and record
    its latency under ``verb``."""
    started = time.perf_counter()
    reply = Response(view(), media_type="application/json")
    metrics_of(request).request.labels(verb).observe(time.perf_counter() - started)
    return reply


async def timed_view_off_loop(request: Request, verb: str, view: Callable[[], bytes]) -> Response:
    """:func:`timed_view` run in a worker thread, for a view whose build reads only what
    its service hands out under its own lock (the verbs share this loop)."""
    return await run_in_threadpool(timed_view, request, verb, view)


def engine_of(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


def settings_of(request: Request) -> ServiceSettings:
    settings: ServiceSettings = request.app.state.settings
    return settings


def metrics_of(request: Request) -> PrometheusMetrics:
    metrics: PrometheusMetrics = request.app.state.metrics
    return metrics


async def read_body(request: Request, limit: int | None = None) -> bytes:
    """The request body, refusing more than ``limit`` (default ``max_body_bytes``; 413)
    before reading it all, a compressed one or one that says it is not JSON (415), one
    cut short by the client (400) and one that does not arrive within
    ``body_timeout_seconds`` (408)."""
    settings = settings_of(request)
    if limit is None:
        limit = settings.max_body_bytes
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise ApiError(415, f"Content-Encoding {encoding[:40]} is not supported; send plain JSON")
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        # kube-scheduler, the API server and the agent send JSON; a form or text body is
        # what a browser's cross-site POST sends without asking first
        raise ApiError(415, f"Content-Type {media[:60]} is not JSON; send application/json")
    try:
        async with asyncio.timeout(settings.body_timeout_seconds):
            return await _read_within(request, limit)
    except TimeoutError:
        raise ApiError(
            408, f"the request body did not arrive within {settings.body_timeout_seconds:g} s"
        ) from None


async def _read_within(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise ApiError(400, "Content-Length is not a number") from None
        if size > limit:
            raise ApiError(413, f"request body of {size} bytes exceeds the limit of {limit}")
    chunks = []
    total = 0
    try:
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise ApiError(413, f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:  # the caller hung up: its mistake, not ours (no traceback)
        raise ApiError(400, "the client disconnected before sending the whole body") from None
    return b"".join(chunks)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:10]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "body"
        parts.append(f"{where}: {err.get('msg')}")
    return "; ".join(parts)


async def read_model(request: Request, model: type[M], limit: int | None = None) -> M:
    """Parse and validate a JSON body into ``model``; 400 names every wrong field.

    orjson turns the bytes into Python objects and pydantic validates those: about
    twice as fast as pydantic's own JSON parser on bodies that carry Node objects."""
    body = await read_body(request, limit)
    if not body.strip():
        raise ApiError(400, "empty request body; expected a JSON object")
    if len(body) > INLINE_PARSE_BYTES:  # tens of MiB parse for seconds: not on the loop
        return await run_in_threadpool(_parse, body, model)
    return _parse(body, model)


def _parse(body: bytes, model: type[M]) -> M:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise ApiError(400, f"malformed JSON: {err}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(400, f"invalid {model.__name__}: {_describe(exc)}") from None


def require_auth(request: Request) -> None:
    """State-changing endpoints: on the mTLS listener a verified client certificate
    whose CN or DNS/URI SAN is one of ``client_cert_names`` (the scheduler's), else
    ``Authorization: Bearer <token>``; 401 otherwise."""
    settings = settings_of(request)
    _authenticate(request, settings.allowed_client_names)


def require_agent_auth(request: Request) -> str | None:
    """Observation reports; returns the node the caller may report for, or None for any.

    ``agent_auth: shared``: a verified client certificate named in ``agent_cert_names``
    (the node agents'), else the bearer token (None: one credential for every node).  An
    agent's certificate does not open bind, nor the scheduler's this endpoint.
    ``serviceaccount``: the agent's projected ServiceAccount token, whose node the API
    server vouches for (``service.agent_auth``); 401, 403, or 503 with Retry-After."""
    agents: AgentAuthenticator | None = request.app.state.agent_auth
    if agents is None:
        _authenticate(request, settings_of(request).allowed_agent_names)
        return None
    token = _bearer_token(request)
    if token is None:
        raise _unauthenticated("authentication required: Authorization: Bearer <the agent's "
                               "projected ServiceAccount token>")  # fmt: skip
    try:
        return agents.node_of(token)
    except AgentRefused as exc:
        if exc.status == 401:
            raise _unauthenticated(exc.message) from None
        retry = {"Retry-After": str(RETRY_AFTER_SECONDS)} if exc.status == 503 else None
        raise ApiError(exc.status, exc.message, retry) from None


def _bearer_token(request: Request) -> str | None:
    """The token of ``Authorization: Bearer <token>``, None without one."""
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    given = given.strip()
    return given if scheme.lower() == "bearer" and given else None


def _unauthenticated(message: str) -> ApiError:
    return ApiError(401, message, {"WWW-Authenticate": "Bearer"})


def _authenticate(request: Request, names: tuple[str, ...]) -> None:
    settings = settings_of(request)
    server = request.scope.get("server") or (None, None)
    if settings.client_ca_file and server[1] == settings.port:
        # uvicorn required a certificate signed by client_ca_file; api.listeners put
        # its names in the scope.  Any name of the CA is not enough: only the allowed.
        tls = (request.scope.get("extensions") or {}).get("tls") or {}
        if set(tls.get("client_cert_names", ())) & set(names):
            return
    bearer: BearerToken = request.app.state.bearer
    given = _bearer_token(request)
    # Bytes, not str: compare_digest refuses non-ASCII text (a TypeError, i.e. a 500).
    # Starlette decoded the header's bytes as latin-1: encoding back gives those bytes.
    if given is not None and bearer.accepts(given.encode("latin-1")):
        return
    raise _unauthenticated(
        "authentication required: Authorization: Bearer <token> or a client certificate"
    )
