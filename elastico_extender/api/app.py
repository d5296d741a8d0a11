"""The app factory: ``create_app(settings, cluster)`` -> a FastAPI app (STYLE habit 13).

Settings and the cluster are passed in, never built at import.  The app's
lifespan starts the cluster view and the epoch loop and stops them again.
Routes: extender verbs under ``/scheduler`` (the KubeSchedulerConfiguration's
``urlPrefix``), REST views at the root, the webhook at ``/mutate``, and
``/healthz``, ``/readyz``, ``/metrics``; OpenAPI docs at ``/docs``.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from elastico_extender import __version__
from elastico_extender.api.deps import ApiError, json_response
from elastico_extender.api.docs import install_docs
from elastico_extender.api.fastpath import DirectRoutes
from elastico_extender.api.guard import CatchAll
from elastico_extender.api.routes import extender, observations, ops, rest, webhook
from elastico_extender.api.validate import LargestNode
from elastico_extender.bearer import BearerToken
from elastico_extender.cluster.base import Cluster
from elastico_extender.cluster.kube import KubeCluster
from elastico_extender.core.closed_loop import ClosedLoop
from elastico_extender.core.interference.online import OnlineCorrection
from elastico_extender.core.interference.predictor import ContentionPredictor, SlowdownPredictor
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.errors import ProfileStoreError
from elastico_extender.profiles.completions import CompletionStore
from elastico_extender.profiles.store import ProfileStore
from elastico_extender.service.agent_auth import AgentAuthenticator
from elastico_extender.service.checkpoint import CheckpointCollector, LearnedCheckpoint
from elastico_extender.service.completions import CompletionRecorder
from elastico_extender.service.engine import Engine
from elastico_extender.service.events import EventRecorder
from elastico_extender.service.families import FamilyResolver
from elastico_extender.service.metrics import PrometheusMetrics
from elastico_extender.service.observations import (
    ObservationCollector,
    ObservationService,
    open_store,
)
from elastico_extender.service.predictor import resolve_predictor
from elastico_extender.service.settings import ServiceSettings
from elastico_extender.service.succession import Succession

__all__ = ["EXTENDER_PREFIX", "create_app"]

log = logging.getLogger(__name__)

EXTENDER_PREFIX = "/scheduler"


def _token(settings: ServiceSettings) -> tuple[BearerToken, bool]:
    """(the bearer token, whether it was generated here); a token file is re-read when
    the Secret behind it is rotated (``elastico_extender.bearer``)."""
    if settings.token_file:
        try:
            return BearerToken.from_file(settings.token_file), False
        except ValueError as exc:
            raise ValueError(f"token_file: {exc}") from exc
    return BearerToken(secrets.token_urlsafe(32)), True


def _agent_auth(settings: ServiceSettings, cluster: Cluster) -> AgentAuthenticator | None:
    """Per-node agent identity (``agent_auth: serviceaccount``): the API server reviews
    each agent's token, so it needs one (ValueError on an embedded cluster); None: the
    shared credential."""
    if settings.agent_auth != "serviceaccount":
        return None
    inner = getattr(cluster, "inner", cluster)
    if not isinstance(inner, KubeCluster):
        raise ValueError(
            "agent_auth: serviceaccount needs a Kubernetes API server to review the agents' "
            f"tokens; this extender serves the {cluster.description} (use agent_auth: shared)"
        )
    return AgentAuthenticator(
        inner.review_token,
        inner.state,
        audience=settings.agent_token_audience,
        service_account=settings.agent_service_account,
    )


def _leadership(cluster: Cluster) -> Callable[[], bool]:
    """The engine's write gate: the Lease elector's answer when replicas elect a leader
    (``LeaderGatedCluster``), else always True (one replica)."""
    elector = getattr(cluster, "elector", None)
    return elector.is_leader if elector is not None else (lambda: True)


def _event_recorder(settings: ServiceSettings, cluster: Cluster) -> EventRecorder | None:
    """Events go to a real cluster only (a KubeCluster, leader-gated or not); the
    actuator records them on the leader only."""
    inner = getattr(cluster, "inner", cluster)
    if not isinstance(inner, KubeCluster):
        return None
    return EventRecorder(inner.api.api_client, identity=settings.identity)


def _checkpoint(
    settings: ServiceSettings,
    cluster: Cluster,
    observed: ObservationService,
    completions: CompletionRecorder,
    succession: Succession,
) -> LearnedCheckpoint | None:
    """The learned-state checkpoint on a real cluster (a KubeCluster, leader-gated or not):
    restored at start and, with leader election, whenever this replica becomes leader."""
    inner = getattr(cluster, "inner", cluster)
    if not settings.learned_checkpoint or not isinstance(inner, KubeCluster):
        return None
    elector = getattr(cluster, "elector", None)
    checkpoint = LearnedCheckpoint(
        inner.api.api_client,
        observed,
        namespace=settings.learned_namespace or settings.lease_namespace,
        name=settings.learned_configmap,
        is_leader=_leadership(cluster),
        term=(lambda: int(elector.transitions)) if elector is not None else (lambda: 0),
        identity=settings.identity or getattr(elector, "identity", ""),
        period=settings.learned_checkpoint_seconds,
        max_bytes=settings.learned_checkpoint_max_bytes,
        completions=completions,
        succession=succession,
    )
    if elector is not None:
        started = elector.on_started

        def restore_then_lead() -> bool:
            if started is not None and not started():
                return False
            restore_or_start_empty(checkpoint)  # before it leads: what the last leader knew
            return True

        elector.on_started = restore_then_lead
    return checkpoint


def restore_or_start_empty(checkpoint: LearnedCheckpoint) -> None:
    """Merge the stored checkpoint; any failure is logged and this replica goes on
    without it (it learns again), so neither a start nor a takeover ever waits on it."""
    try:
        checkpoint.restore()
    except Exception:
        log.exception("checkpoint.restore_failed")


def create_app(
    settings: ServiceSettings,
    cluster: Cluster,
    *,
    planner_settings: PlannerSettings | None = None,
    predictor: SlowdownPredictor | None = None,
    predictor_degraded: str | None = None,
    store: ProfileStore | None = None,
) -> FastAPI:
    """Build the service. ``predictor`` is injectable; by default it is resolved from
    ``settings.predictor_model`` (the shipped model when none; the contention heuristic,
    degraded, when the model cannot be loaded).
    ``planner_settings`` replaces ``settings.planner`` (tests)."""
    if predictor is None:
        predictor, predictor_degraded = resolve_predictor(settings.predictor_model)
    profile_path = settings.profile_store or settings.observation_store
    if store is None and profile_path:
        # measured profiles (unprofiled workloads' solo windows) need a home that survives
        # a restart: the profile store's file, else the observation store's
        try:
            store = ProfileStore(profile_path)
        except ProfileStoreError as exc:
            if settings.profile_store:
                raise
            raise ProfileStoreError(
                f"observation_store: {exc} (with no profile_store set, measured profiles "
                "are kept in the observation store's file)"
            ) from None
    metrics = PrometheusMetrics()
    if predictor_degraded:
        metrics.set_degraded(predictor_degraded)
    # Observed beats predicted (issue 11): the planner asks the online correction, which
    # answers the base model's prediction until the cluster's own pairs say otherwise.
    correction = OnlineCorrection(predictor or ContentionPredictor())
    observed = ObservationService(
        settings, open_store(settings), loop=ClosedLoop(correction), profiles=store
    )
    elector = getattr(cluster, "elector", None)
    observed.gate(_leadership(cluster), lambda: str(getattr(elector, "holder", "")))
    # finished pods teach expected run times (length-aware queueing); kept beside profiles
    # and in the leader's checkpoint
    completion_store = CompletionStore(profile_path) if profile_path else None
    completions = CompletionRecorder(completion_store)
    succession = Succession()  # evicted pods' jobs, for their replacements; checkpointed
    checkpoint = _checkpoint(settings, cluster, observed, completions, succession)
    events = _event_recorder(settings, cluster)
    engine = Engine(
        settings,
        cluster,
        planner_settings=planner_settings,
        predictor=observed.guarded(correction),
        predictor_degraded=predictor_degraded,
        families=FamilyResolver(settings.default_gpu_memory_mib, store=store),
        metrics=metrics,
        is_leader=_leadership(cluster),
        events=events,
        observed=lambda: observed.for_snapshot()[0],
        unmeasured=observed.unmeasured,
        solo_rates=observed.solo_rates,
        completions=completions,
        succession=succession,
    )
    changed = engine.planner_settings.changed()
    if changed:  # said once: a tuned planner explains its plans
        log.info("planner.settings", extra={"changed": changed})
    observed.attach(lambda: engine.published if engine.has_plan else None, engine.forget_family)
    metrics.registry.register(ObservationCollector(observed))
    if checkpoint is not None:
        metrics.registry.register(CheckpointCollector(checkpoint))
    bearer, generated = _token(settings)
    agent_auth = _agent_auth(settings, cluster)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if checkpoint is not None:
            restore_or_start_empty(checkpoint)  # before the first plan: what was learned
        cluster.start()
        if events is not None:
            events.start()
        engine.start()
        if checkpoint is not None:
            checkpoint.start()
        log.info("service.started", extra={"cluster": cluster.description})
        try:
            yield
        finally:
            engine.stop()
            if checkpoint is not None:
                checkpoint.stop(final=True)  # while still holding the Lease
            if events is not None:
                events.stop()
            cluster.stop()
            observed.close()
            if completion_store is not None:
                completion_store.close()

    app = FastAPI(
        title="ElastiCo scheduler extender",
        version=__version__,
        description=(
            "kube-scheduler extender (filter/prioritize/bind/preempt), REST views of the "
            "ElastiCo plan, and the pod mutating webhook."
        ),
        lifespan=lifespan,
        docs_url=None,  # install_docs: served from packaged assets (air-gapped clusters)
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.observations = observed
    app.state.checkpoint = checkpoint
    app.state.bearer = bearer  # what requests are checked against
    app.state.token = bearer.current()  # the token at start (printed when generated)
    app.state.token_generated = generated
    app.state.agent_auth = agent_auth  # None: agents use the shared credential
    app.state.largest_node = LargestNode()

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return json_response({"Error": exc.message}, exc.status, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return json_response({"Error": str(exc.errors()[:5])}, 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return json_response({"Error": str(exc.detail)}, exc.status_code)

    app.include_router(extender.router, prefix=EXTENDER_PREFIX)
    app.add_middleware(
        DirectRoutes,
        routes={
            f"{EXTENDER_PREFIX}/filter": extender.filter_nodes,
            f"{EXTENDER_PREFIX}/prioritize": extender.prioritize_nodes,
        },
    )
    app.include_router(rest.router)
    app.include_router(webhook.router)
    app.include_router(ops.router)
    app.include_router(observations.router)
    install_docs(app)
    app.add_middleware(CatchAll)  # added last: outermost of ours, inside Starlette's own
    return app
