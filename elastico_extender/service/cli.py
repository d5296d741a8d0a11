"""``elastico serve``: run the extender (``serve_main(argv)``; ``main`` is the same).

Command:

    python -m elastico_extender.service.cli --port 8888            # embedded cluster
    python -m elastico_extender.service.cli --kubeconfig ~/.kube/config

With no ``--kubeconfig``, no ``--embedded`` and not running inside a pod, the
extender serves the embedded cluster shipped with the package and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import socket
import ssl
import sys
from collections.abc import Sequence
from typing import Any

import uvicorn

from elastico_extender.cluster.base import Cluster
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.core.settings import assignments
from elastico_extender.service.gc_policy import FreezeAfterEpochs
from elastico_extender.service.logs import configure_logging
from elastico_extender.service.settings import PLANNER, ServiceSettings
from elastico_extender.userfiles import reason

__all__ = ["build_cluster", "build_servers", "listen", "main", "parser", "serve_main"]

log = logging.getLogger(__name__)

GIL_SWITCH_SECONDS = 0.0005
"""How long a thread may hold the interpreter while another waits (CPython: 5 ms)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="elastico serve",
        description="Serve the ElastiCo kube-scheduler extender, REST views and webhook.",
        epilog="Every flag but --config also reads ELASTICO_<NAME> from the environment "
        "(--planner: ELASTICO_PLANNER_<NAME>, one variable per setting); --config takes a "
        "JSON/YAML file of the same names. Defaults: elastico_extender/service/settings.py.",
    )
    p.add_argument("--config", help="settings file (JSON or YAML)")
    p.add_argument("--host", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="extender/REST port (default 8888)")
    p.add_argument("--webhook-port", type=int, help="separate TLS port for the webhook")
    p.add_argument(
        "--views-port",
        type=int,
        help="TLS port without client certificates for the REST views, /metrics and the "
        "agents' POST /observations (bearer token); the chart uses 8444 (default: off)",
    )
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster config)")
    p.add_argument("--embedded", help="v1 List file of Node/Pod objects to serve instead")
    p.add_argument(
        "--embedded-state",
        help="file keeping the embedded cluster's binds across restarts (default: memory only)",
    )
    p.add_argument("--epoch-seconds", type=float, help="planning interval (default 5 s)")
    p.add_argument("--tls-cert", help="PEM server certificate")
    p.add_argument("--tls-key", help="PEM server key")
    p.add_argument("--client-ca-file", help="require client certificates signed by this CA")
    p.add_argument(
        "--client-cert-names",
        help="comma-separated CN/SAN names of client certificates that may bind without a "
        "token (default elastico-scheduler)",
    )
    p.add_argument(
        "--agent-cert-names",
        help="comma-separated CN/SAN names of client certificates that may post "
        "observations without a token (default elastico-agent)",
    )
    p.add_argument(
        "--agent-auth",
        choices=["shared", "serviceaccount"],
        help="how node agents authenticate POST /observations: shared (the token or an "
        "--agent-cert-names certificate, for any node; default) or serviceaccount (each "
        "agent's projected ServiceAccount token, reviewed by the API server: its own node only)",
    )
    p.add_argument(
        "--agent-token-audience",
        help="audience of the agents' projected tokens (default elastico-extender)",
    )
    p.add_argument(
        "--agent-service-account",
        help="NAMESPACE:NAME of the agents' ServiceAccount "
        "(default elastico-system:elastico-agent)",
    )
    p.add_argument("--token-file", help="bearer token for state-changing endpoints")
    p.add_argument("--scheduler-name", help="schedulerName of pods to plan for")
    p.add_argument(
        "--predictor-model",
        help="ONNX interference model (default: the one shipped with the package; "
        "'heuristic': the contention heuristic, chosen; a model that cannot be loaded leaves "
        "the contention heuristic, reported degraded in /healthz)",
    )
    p.add_argument("--profile-store", help="SQLite profile store")
    p.add_argument(
        "--observation-store",
        help="SQLite file for observed reference rates and pair samples (default: profile store)",
    )
    p.add_argument(
        "--max-migrations-per-epoch",
        type=int,
        help="pods evicted per epoch to carry out the plan's moves (default 1; 0: log only)",
    )
    p.add_argument(
        "--planner",
        action="append",
        metavar="NAME=VALUE",
        help="a planner setting (repeatable), e.g. --planner tau_default=1.4; names and "
        "defaults: elastico_extender/core/settings.py (docs/service.md)",
    )
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        help="text: event key=value ... (default); json: one JSON object per line",
    )
    return p


def settings_from(args: argparse.Namespace) -> ServiceSettings:
    """Settings from the file, the environment and the flags; ValueError names each field."""
    overrides = {k: v for k, v in vars(args).items() if k != "config" and v is not None}
    if args.planner:
        overrides[PLANNER] = assignments(args.planner, "--planner")
    return ServiceSettings.load(args.config, overrides=overrides)


def build_cluster(settings: ServiceSettings) -> Cluster:
    """Kubernetes when configured (kubeconfig or in a pod), else the embedded file."""
    in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if settings.kubeconfig or (in_pod and not settings.embedded):
        from elastico_extender.cluster.kube import KubeCluster, api_client_from

        api_client = api_client_from(settings.kubeconfig)
        kube = KubeCluster(
            api_client,
            resync_seconds=settings.resync_seconds,
            watch_timeout_seconds=settings.watch_timeout_seconds,
            watch_grace_seconds=settings.watch_grace_seconds,
        )
        if not settings.leader_election:
            return kube
        from elastico_extender.service.leader import LeaseTiming, elect

        _, gated = elect(
            kube,
            api_client,
            name=settings.lease_name,
            namespace=settings.lease_namespace,
            identity=settings.identity or None,
            timing=LeaseTiming(
                settings.lease_duration_seconds,
                settings.renew_deadline_seconds,
                settings.retry_period_seconds,
            ),
        )
        return gated  # type: ignore[return-value]
    return EmbeddedCluster.from_file(settings.embedded, state_file=settings.embedded_state)


def _config(app: Any, settings: ServiceSettings, port: int, mtls: bool) -> uvicorn.Config:
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    from elastico_extender.api.listeners import with_client_certificate

    kwargs: dict[str, Any] = {}
    if settings.tls_cert:
        kwargs.update(ssl_certfile=settings.tls_cert, ssl_keyfile=settings.tls_key)
        if mtls and settings.client_ca_file:
            kwargs.update(
                ssl_ca_certs=settings.client_ca_file,
                ssl_cert_reqs=ssl.CERT_REQUIRED,
                http=with_client_certificate(AutoHTTPProtocol),
            )
    return uvicorn.Config(
        app, host=settings.host, port=port, log_config=None, access_log=False, **kwargs
    )


def listener_ports(settings: ServiceSettings) -> list[int]:
    """The ports ``build_servers`` listens on, in its order."""
    ports = [settings.port]
    if settings.webhook_port is not None:
        ports.append(settings.webhook_port)
    if settings.views_port:
        ports.append(settings.views_port)
    return ports


def build_servers(app: Any, settings: ServiceSettings) -> list[uvicorn.Server]:
    """The extender listener (mTLS when ``client_ca_file``); with ``webhook_port`` the
    webhook listener, which serves only /mutate and health; with ``views_port`` the
    views listener (api.listeners)."""
    from elastico_extender.api.listeners import (
        VIEWS_PATHS,
        VIEWS_PREFIXES,
        WEBHOOK_PATHS,
        OnlyPaths,
    )

    servers = [uvicorn.Server(_config(app, settings, settings.port, mtls=True))]
    restricted: list[tuple[Any, int]] = []
    if settings.webhook_port is not None:
        restricted.append((OnlyPaths(app, WEBHOOK_PATHS, "webhook port"), settings.webhook_port))
    if settings.views_port:
        views = OnlyPaths(app, VIEWS_PATHS, "views port", VIEWS_PREFIXES)
        restricted.append((views, settings.views_port))
    for only, port in restricted:
        server = uvicorn.Server(_config(only, settings, port, mtls=False))
        server.config.lifespan = "off"  # the app's lifespan runs once, with the first
        servers.append(server)
    return servers


def serve_main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = settings_from(args)
    except (ValueError, OSError) as exc:
        print(f"elastico serve: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    try:
        check_tls_files(settings)
    except OSError as exc:
        print(f"elastico serve: cannot start: {exc}", file=sys.stderr)
        return 1
    from elastico_extender.api.app import create_app

    try:
        cluster = build_cluster(settings)
        app = create_app(settings, cluster)
    except Exception as exc:  # reported, not a traceback: usually a bad path or kubeconfig
        print(f"elastico serve: cannot start: {exc}", file=sys.stderr)
        return 1
    try:  # bound before the banner: a busy port is an error, not a server that looks up
        sockets = [listen(settings.host, port) for port in listener_ports(settings)]
    except OSError as exc:
        print(f"elastico serve: cannot listen: {exc}", file=sys.stderr)
        return 1
    if isinstance(cluster, EmbeddedCluster):
        print(
            f"elastico: no Kubernetes cluster configured; serving the {cluster.description}",
            file=sys.stderr,
        )
        if cluster.state_file is None:
            print(
                "elastico: the embedded cluster lives in memory: binds are lost when this "
                "process ends (--embedded-state FILE keeps them)",
                file=sys.stderr,
            )
    if app.state.token_generated:
        print(
            f"elastico: state-changing endpoints need 'Authorization: Bearer {app.state.token}'"
            " (generated; pass --token-file to fix one)",
            file=sys.stderr,
        )
    scheme = "https" if settings.tls_cert else "http"
    print(
        f"elastico: extender at {scheme}://{settings.host}:{settings.port}/scheduler, "
        f"docs at {scheme}://{settings.host}:{settings.port}/docs",
        file=sys.stderr,
    )
    if settings.views_port:
        print(
            f"elastico: views, /metrics and POST /observations (token) at "
            f"{scheme}://{settings.host}:{settings.views_port}",
            file=sys.stderr,
        )
    servers = build_servers(app, settings)
    # Everything built so far (modules, the app, the cluster objects) lives as long as
    # the process: keep it out of the cyclic collector's scans, so a full collection
    # walks only what requests and epochs created (in-process with 1,000 nodes, 115k
    # tracked objects of which 5k stay scanned; no pause over 0.3 ms in 500 pods).
    gc.collect()
    gc.freeze()
    app.state.engine.after_epoch.append(FreezeAfterEpochs())
    _report_leadership(cluster, app.state.metrics)
    # The epoch thread computes for tens of ms; a verb waiting for the interpreter
    # lock gets it after at most this long instead of CPython's default 5 ms.
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_all(servers, sockets))
    return 0


def check_tls_files(settings: ServiceSettings) -> None:
    """Load the TLS files now, so a bad one fails before the banner; uvicorn would load
    them only once serving, into a traceback.  OSError names the setting and the file."""
    if not settings.tls_cert:
        return
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
    except OSError as exc:  # ssl.SSLError included
        raise OSError(
            f"tls_cert/tls_key: cannot load {settings.tls_cert} and {settings.tls_key}: "
            f"{reason(exc)}"
        ) from None
    if settings.client_ca_file:
        try:
            context.load_verify_locations(settings.client_ca_file)
        except OSError as exc:
            raise OSError(
                f"client_ca_file: cannot load {settings.client_ca_file}: {reason(exc)}"
            ) from None


def _report_leadership(cluster: Cluster, metrics: Any) -> None:
    """elastico_leader is 1 on the Lease holder (always 1 without leader election)."""
    elector = getattr(cluster, "elector", None)
    if elector is None:
        metrics.leader.set(1)
        return
    started, stopped = elector.on_started, elector.on_stopped

    def on_started() -> bool:
        ok = started() if started is not None else True
        metrics.leader.set(1 if ok else 0)
        return ok

    def on_stopped() -> None:
        metrics.leader.set(0)
        if stopped is not None:
            stopped()

    elector.on_started, elector.on_stopped = on_started, on_stopped


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket; OSError names the address when it is taken.

    The protocol is named: asyncio turns Nagle off (TCP_NODELAY) only on accepted
    sockets whose proto is IPPROTO_TCP, and without it every reply on a kept-alive
    connection waited for the client's delayed ACK (about 40 ms)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"{host}:{port}: {reason(exc)}") from None
    sock.set_inheritable(True)
    return sock


async def _serve_all(servers: list[uvicorn.Server], sockets: list[socket.socket]) -> None:
    await asyncio.gather(
        *(s.serve(sockets=[sock]) for s, sock in zip(servers, sockets, strict=True))
    )


main = serve_main

if __name__ == "__main__":
    sys.exit(serve_main())
