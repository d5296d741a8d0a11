"""Node agents' observations: ``POST /observations`` (authenticated), ``GET /observations``.

The body names the agent's node and one window per pod::

    {"node": "gpu-7",
     "observations": [{"pod_uid": "0b6c...", "end": 1763845200.0, "seconds": 10.0,
                       "rate": 4210.5, "unit": "launches/s",
                       "configuration": "batch_size=64,amp=on",      # optional
                       "peak_mem_mib": 18432.0, "sm_activity": 0.62,  # optional
                       "mixed": false}]}  # optional: a co-tenant came, went or restarted

Every field is checked (types, finite, non-negative, lengths, unknown fields) and so is
every window against the published plan (:mod:`elastico_extender.service.observations`).
Any problem refuses the whole batch with a 4xx whose ``Error`` names each field (and
``refused`` lists the item indices, so an agent can resend the rest); nothing changes.

With ``agent_auth: serviceaccount`` the caller's token names its node
(``service/agent_auth.py``): a body whose ``node`` is another is refused with 403, so each
window is checked against the pods of the caller's own node.

``GET /observations`` is the whole report unless ``limit`` or ``continue`` is given; then
one page of it, as /jobs is paged (:func:`~elastico_extender.api.routes.rest.whole_or_page`,
:meth:`RestViews.page`): the members with a row per pod or pair
(:data:`~elastico_extender.service.observations.ROW_LISTS`) are cut into pages, each page
carrying all four with its rows of them, and the summary comes on the first page.

Every answer of ``POST /observations`` past authentication, taken or refused, and a 503
of the agent's token review, carries :data:`MAX_AGE_HEADER`: the
``observation_max_age_seconds`` this replica refuses windows beyond, so the agent holds
and resends refused windows exactly as long as they can still be taken
(``agent/reporter.py``).
"""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from elastico_extender.agent import MAX_AGE_HEADER
from elastico_extender.api.deps import (
    ApiError,
    engine_of,
    json_response,
    read_model,
    require_agent_auth,
    timed_view_off_loop,
)
from elastico_extender.api.routes.rest import Continue, Limit, whole_or_page
from elastico_extender.core.observations import MAX_RATE
from elastico_extender.service.observations import (
    AgentWindow,
    ObservationRefused,
    ObservationService,
)
from elastico_extender.service.views import to_json

__all__ = ["MAX_AGE_HEADER", "MAX_BODY_BYTES", "MAX_WINDOWS", "ObservationBatch", "router"]

router = APIRouter(tags=["closed loop"])

MAX_WINDOWS = 2048
"""Windows per request: one per pod on a node, with a wide margin."""
MAX_BODY_BYTES = 1 << 20
"""Largest accepted body, bytes (2,048 windows of about 300 bytes fit in 1 MiB)."""

Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]


class WindowItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pod_uid: Annotated[str, Field(strict=True, min_length=1, max_length=128)]
    end: Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
    seconds: Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
    rate: Annotated[float, Field(strict=True, ge=0, le=MAX_RATE, allow_inf_nan=False)]
    unit: Annotated[str, Field(strict=True, pattern=r"^[A-Za-z0-9_.:]{1,32}/s$")]
    configuration: Annotated[str | None, Field(strict=True, max_length=512)] = None
    peak_mem_mib: NonNegative | None = None
    sm_activity: Annotated[float | None, Field(strict=True, ge=0, le=1, allow_inf_nan=False)] = None
    mixed: Annotated[bool, Field(strict=True)] = False


class ObservationBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    node: Annotated[str, Field(strict=True, min_length=1, max_length=253)]
    observations: Annotated[list[WindowItem], Field(max_length=MAX_WINDOWS)]


def service_of(request: Request) -> ObservationService:
    service: ObservationService = request.app.state.observations
    return service


def max_age(request: Request) -> dict[str, str]:
    """The header that tells the agent how long a refused window can still be taken."""
    return {MAX_AGE_HEADER: f"{service_of(request).settings.observation_max_age_seconds:.15g}"}


def agent_caller(request: Request) -> str | None:
    """``require_agent_auth``, whose 503 (the API server cannot review the agent's token
    now) also says how long the agent may hold its windows: such an outage can outlast
    the agent's default hold."""
    try:
        return require_agent_auth(request)
    except ApiError as exc:
        if exc.status != 503:
            raise
        raise ApiError(exc.status, exc.message, {**exc.headers, **max_age(request)}) from None


@router.post(
    "/observations",
    summary="A node agent's windows: progress rate, peak memory, SM activity per pod",
)
async def post_observations(
    request: Request, caller: Annotated[str | None, Depends(agent_caller)]
) -> Response:
    service = service_of(request)
    bound = max_age(request)
    try:
        batch = await read_model(request, ObservationBatch, MAX_BODY_BYTES)
    except ApiError as exc:
        raise ApiError(exc.status, exc.message, {**exc.headers, **bound}) from None
    if caller is not None and batch.node != caller:  # its token proves another node
        mine = f"its token is bound to {caller!r}"
        raise ApiError(403, f"node: {batch.node!r} is not this agent's node ({mine})", bound)
    windows = [AgentWindow(**item.model_dump()) for item in batch.observations]
    try:
        result = await run_in_threadpool(service.ingest, batch.node, windows)
    except ObservationRefused as exc:
        # 503 (a follower): the agent's next window goes to the leader the Service selects
        retry = {"Retry-After": "2", **bound} if exc.status == 503 else bound
        return json_response(
            {"Error": "; ".join(exc.problems[:20]), "refused": exc.refused}, exc.status, retry
        )
    return json_response(result, headers=bound)


@router.get(
    "/observations",
    summary="Observed vs predicted slowdown per pod and pair, prediction error, staleness, "
    "pairs separated and why (pods and pairs in pages with limit and continue)",
)
async def get_observations(
    request: Request, limit: Limit = None, continue_: Continue = None
) -> Response:
    engine = engine_of(request)
    if not engine.has_plan:
        raise ApiError(409, "no plan published yet")
    service = service_of(request)  # its view copies under the service's lock, then builds
    read = whole_or_page(
        request,
        lambda: to_json(service.view()),
        partial(engine.views.page, "observations", service.sections),
    )
    return await timed_view_off_loop(request, "observations", read)
