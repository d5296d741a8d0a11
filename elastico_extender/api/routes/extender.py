"""The kube-scheduler extender verbs: filter, prioritize, bind, preempt.

Bodies are parsed straight from bytes into the :mod:`..extender_v1` models and
replies are written with the Go field names.  Client mistakes get a 4xx with an
``Error`` field; anything unexpected inside a verb is logged and answered with
an ``Error`` field (the scheduler retries the pod) rather than a 500.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from elastico_extender.api.deps import (
    ApiError,
    engine_of,
    json_response,
    metrics_of,
    read_model,
    require_auth,
)
from elastico_extender.api.encoding import host_priority_json
from elastico_extender.api.extender_v1 import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
)
from elastico_extender.api.validate import checked_pod, oversized_request

__all__ = ["router"]

log = logging.getLogger(__name__)

router = APIRouter(tags=["extender"])


def _body(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": model.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
                }
            },
        }
    }


async def _timed(
    request: Request, verb: str, handler: Callable[[], Awaitable[Response]], error_body: Any
) -> Response:
    started = time.perf_counter()
    try:
        response = await handler()
        # The extender's own time, without transport (standard Server-Timing header).
        ms = (time.perf_counter() - started) * 1000.0
        response.headers["Server-Timing"] = f"extender;dur={ms:.3f}"
        return response
    except ApiError:
        raise
    except Exception:  # degrade, don't crash: the scheduler sees the Error and retries
        # The details go to the log, not to the caller (no Python internals on the wire).
        log.exception("verb.failed", extra={"verb": verb})
        return json_response(error_body(f"elastico could not answer {verb}; see the extender log"))
    finally:
        metrics_of(request).request.labels(verb).observe(time.perf_counter() - started)


def _names(args: ExtenderArgs) -> list[str]:
    if args.nodes is None:
        return list(args.node_names or [])
    names = []
    for i, item in enumerate(args.nodes.items):
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            raise ApiError(400, f"Nodes.items[{i}] has no metadata.name")
        names.append(name)
    return names


def _filter_error(message: str) -> dict[str, Any]:
    return {"NodeNames": [], "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}


@router.post(
    "/filter",
    response_model=ExtenderFilterResult,
    openapi_extra=_body(ExtenderArgs),
    summary="Extender filter (ExtenderArgs -> ExtenderFilterResult)",
)
async def filter_nodes(request: Request) -> Response:
    async def handle() -> Response:
        args = await read_model(request, ExtenderArgs)
        gpus = checked_pod(args.pod)
        names = _names(args)
        engine = engine_of(request)
        too_big = oversized_request(gpus, request.app.state.largest_node.gpus(engine))
        if too_big is not None:
            reply: dict[str, Any] = {
                "NodeNames": [],
                "FailedNodes": {},
                "FailedAndUnresolvableNodes": dict.fromkeys(names, too_big),
                "Error": "",
            }
        else:
            outcome = engine.filter(args.pod, names)
            reply = {
                "NodeNames": outcome.passed,
                "FailedNodes": outcome.failed,
                "FailedAndUnresolvableNodes": outcome.unresolvable,
                "Error": "",
            }
        if args.nodes is not None:
            # nodeCacheCapable false: the scheduler reads only Nodes from the reply.
            keep = set(reply["NodeNames"])
            reply["Nodes"] = {
                "metadata": args.nodes.metadata,
                "items": [n for n in args.nodes.items if n["metadata"]["name"] in keep],
            }
            try:
                return json_response(reply)
            except TypeError:  # orjson writes 255 levels of nesting; it reads 1,024
                raise ApiError(
                    400, "Nodes: node objects nested deeper than 255 levels cannot be echoed"
                ) from None
        return json_response(reply)

    return await _timed(request, "filter", handle, _filter_error)


@router.post(
    "/prioritize",
    response_model=list[HostPriority],
    openapi_extra=_body(ExtenderArgs),
    summary="Extender prioritize (ExtenderArgs -> HostPriorityList, scores 0..10)",
)
async def prioritize_nodes(request: Request) -> Response:
    async def handle() -> Response:
        args = await read_model(request, ExtenderArgs)
        gpus = checked_pod(args.pod)
        names = _names(args)
        engine = engine_of(request)
        if oversized_request(gpus, request.app.state.largest_node.gpus(engine)) is not None:
            zeros = [{"Host": n, "Score": 0} for n in dict.fromkeys(names)]
            return json_response(zeros)  # filter named the field; nothing to rank
        scores = engine.prioritize(args.pod, names)
        return Response(host_priority_json(scores), media_type="application/json")

    def error(message: str) -> Any:
        raise ApiError(503, message)

    return await _timed(request, "prioritize", handle, error)


@router.post(
    "/bind",
    response_model=ExtenderBindingResult,
    openapi_extra=_body(ExtenderBindingArgs),
    dependencies=[Depends(require_auth)],
    summary="Extender bind: pick the GPU, write ConfigMap + annotations, create the Binding",
)
async def bind_pod(request: Request) -> Response:
    async def handle() -> Response:
        args = await read_model(request, ExtenderBindingArgs)
        if not args.pod_name or not args.node:
            raise ApiError(400, "PodName and Node are required")
        error = await run_in_threadpool(
            engine_of(request).bind,
            args.pod_namespace or "default",
            args.pod_name,
            args.pod_uid,
            args.node,
        )
        return json_response({"Error": error})

    return await _timed(request, "bind", handle, lambda m: {"Error": m})


@router.post(
    "/preempt",
    response_model=ExtenderPreemptionResult,
    openapi_extra=_body(ExtenderPreemptionArgs),
    summary="Extender preempt: keep candidate victims that really run on known nodes",
)
async def preempt(request: Request) -> Response:
    async def handle() -> Response:
        args = await read_model(request, ExtenderPreemptionArgs)
        checked_pod(args.pod)
        candidates: dict[str, list[str]] = {}
        pdb: dict[str, int] = {}
        if args.node_name_to_meta_victims is not None:
            for node, meta in args.node_name_to_meta_victims.items():
                candidates[node] = [p.uid for p in meta.pods]
                pdb[node] = meta.num_pdb_violations
        elif args.node_name_to_victims is not None:
            for node, victims in args.node_name_to_victims.items():
                uids = []
                for i, victim in enumerate(victims.pods):
                    checked_pod(victim, f"NodeNameToVictims[{node}].Pods[{i}]")
                    uids.append(str(victim["metadata"].get("uid") or ""))
                candidates[node] = uids
                pdb[node] = victims.num_pdb_violations
        kept = engine_of(request).victims(candidates)
        return json_response(
            {
                "NodeNameToMetaVictims": {
                    node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb[node]}
                    for node, uids in kept.items()
                }
            }
        )

    return await _timed(request, "preempt", handle, lambda m: {"NodeNameToMetaVictims": {}})
