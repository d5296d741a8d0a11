"""REST views of the scheduler: prices, jobs, nodes, plan; POST /epoch to replan now.

/jobs and /nodes answer the whole list (a JSON array) unless ``limit`` or ``continue``
is given; then one page of it, shaped as a Kubernetes list (``metadata.continue``,
``metadata.remainingItemCount``, ``items``: :meth:`RestViews.page`).  No default limit:
the clients written for the bare array (curl, dashboards, older ``kubectl elastico``)
keep getting it.  GET /observations (``routes/observations.py``) is read the same way
(:func:`whole_or_page`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from elastico_extender.api.deps import ApiError, engine_of, require_auth, timed_view
from elastico_extender.service.views import MAX_LIMIT, PageRefused, to_json

__all__ = ["Continue", "Limit", "router", "whole_or_page"]

router = APIRouter(tags=["scheduler state"])

Limit = Annotated[
    str | None,
    Query(
        description=f"Rows per page, 1 to {MAX_LIMIT}; the answer is then a list object "
        "whose metadata.continue (absent on the last page) fetches the next page. "
        "Without limit or continue: the whole view as before paging (for /jobs and /nodes "
        "a JSON array)."
    ),
]
Continue = Annotated[
    str | None,
    Query(
        alias="continue",
        description="metadata.continue of the previous page, unchanged: the next page of "
        "the same list (410 Gone once that list is no longer kept: start again without it)",
    ),
]


def page_query(request: Request) -> tuple[int | None, str | None]:
    """``limit`` and ``continue`` of a paged view's request (None: not given); a 400
    naming the parameter when one is given twice or ``limit`` is not 1..MAX_LIMIT."""
    query = request.query_params
    for name in ("limit", "continue"):
        if len(query.getlist(name)) > 1:
            raise ApiError(400, f"{name}: given more than once")
    raw = query.get("limit")
    limit = None
    if raw is not None:
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 6 and 0 < int(raw) <= MAX_LIMIT):
            raise ApiError(
                400,
                f"limit: must be a whole number from 1 to {MAX_LIMIT} (leave it out for the "
                f"whole list), got {raw[:20]!r}",
            )
        limit = int(raw)
    return limit, query.get("continue") or None  # continue= (empty): the first page


def whole_or_page(
    request: Request,
    whole: Callable[[], bytes],
    page: Callable[[int | None, str | None], bytes],
) -> Callable[[], bytes]:
    """What a paged view's request reads: ``whole`` without ``limit`` and ``continue``,
    else the page they ask for (a refused one: its 4xx naming the parameter)."""
    limit, token = page_query(request)
    if limit is None and token is None:
        return whole

    def one_page() -> bytes:
        try:
            return page(limit, token)
        except PageRefused as exc:
            raise ApiError(exc.status, exc.message) from None

    return one_page


def paged_view(request: Request, name: str) -> Response:
    """GET /jobs or /nodes (``name``): whole, or the page ``limit``/``continue`` ask for."""
    engine = engine_of(request)
    read = whole_or_page(request, lambda: engine.view_json(name), partial(engine.view_page, name))
    return timed_view(request, name, read)


@router.get("/prices", summary="Current shadow price per resource and recent history")
async def prices(request: Request) -> Response:
    engine = engine_of(request)
    return timed_view(request, "prices", lambda: to_json(engine.prices()))


@router.get(
    "/jobs",
    summary="Jobs: chosen configuration, predicted slowdown, floor, state "
    "(in pages with limit and continue)",
)
async def jobs(request: Request, limit: Limit = None, continue_: Continue = None) -> Response:
    return paged_view(request, "jobs")


@router.get(
    "/nodes",
    summary="Per-GPU occupancy and co-located pairs (in pages with limit and continue)",
)
async def nodes(request: Request, limit: Limit = None, continue_: Continue = None) -> Response:
    return paged_view(request, "nodes")


@router.get("/plan", summary="The latest published plan")
async def current_plan(request: Request) -> Response:
    engine = engine_of(request)
    return timed_view(request, "plan", lambda: engine.view_json("plan"))


@router.post(
    "/epoch",
    dependencies=[Depends(require_auth)],
    summary="Run one planning epoch now (authenticated) and return the new plan",
)
async def run_epoch(request: Request) -> Response:
    engine = engine_of(request)
    await run_in_threadpool(engine.run_epoch)
    return Response(engine.view_json("plan"), media_type="application/json")
