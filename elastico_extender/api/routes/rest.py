"""REST views of the scheduler: prices, jobs, nodes, plan; POST /epoch to replan now."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from elastico_extender.api.deps import engine_of, json_response, require_auth, timed_view
from elastico_extender.cluster.base import Cluster
from elastico_extender.cluster.objects import pod_key

__all__ = ["router"]

router = APIRouter(tags=["scheduler state"])


@router.get("/prices", summary="Current shadow price per resource and recent history")
async def prices(request: Request) -> Response:
    return timed_view(request, "prices", engine_of(request).prices)


def with_pod_names(rows: list[dict[str, Any]], cluster: Cluster) -> list[dict[str, Any]]:
    """Fill ``pod`` (``namespace/name``) in rows that carry only the pod's UID (the
    invalid pods: they never became jobs), from the cluster view."""
    missing = [row for row in rows if row.get("pod") is None]
    if missing:
        pods = cluster.state.pods()
        for row in missing:
            obj = pods.get(str(row.get("id")))
            row["pod"] = pod_key(obj) if obj is not None else None
    return rows


@router.get("/jobs", summary="Jobs: chosen configuration, predicted slowdown, floor, state")
async def jobs(request: Request) -> Response:
    engine = engine_of(request)
    return timed_view(request, "jobs", lambda: with_pod_names(engine.jobs(), engine.cluster))


@router.get("/nodes", summary="Per-GPU occupancy and co-located pairs")
async def nodes(request: Request) -> Response:
    return timed_view(request, "nodes", engine_of(request).nodes)


@router.get("/plan", summary="The latest published plan")
async def current_plan(request: Request) -> Response:
    return timed_view(request, "plan", engine_of(request).plan_summary)


@router.post(
    "/epoch",
    dependencies=[Depends(require_auth)],
    summary="Run one planning epoch now (authenticated) and return the new plan",
)
async def run_epoch(request: Request) -> Response:
    engine = engine_of(request)
    await run_in_threadpool(engine.run_epoch)
    return json_response(engine.plan_summary())
