"""REST views of the scheduler: prices, jobs, nodes, plan; POST /epoch to replan now."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from elastico_extender.api.deps import engine_of, require_auth, timed_view
from elastico_extender.service.views import to_json

__all__ = ["router"]

router = APIRouter(tags=["scheduler state"])


@router.get("/prices", summary="Current shadow price per resource and recent history")
async def prices(request: Request) -> Response:
    engine = engine_of(request)
    return timed_view(request, "prices", lambda: to_json(engine.prices()))


@router.get("/jobs", summary="Jobs: chosen configuration, predicted slowdown, floor, state")
async def jobs(request: Request) -> Response:
    engine = engine_of(request)
    return timed_view(request, "jobs", lambda: engine.view_json("jobs"))


@router.get("/nodes", summary="Per-GPU occupancy and co-located pairs")
async def nodes(request: Request) -> Response:
    engine = engine_of(request)
    return timed_view(request, "nodes", lambda: engine.view_json("nodes"))


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
