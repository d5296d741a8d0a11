"""``elastico agent``: the closed loop's node agent (run as the DaemonSet in deploy/agent.yaml).

    elastico agent --node "$NODE_NAME" --extender https://elastico-extender.elastico-system:8444 \\
        --token-file /etc/elastico/token/token --ca-file /etc/elastico/tls/ca.crt \\
        --kubelet-root /var/lib/kubelet

Each pod's rings are found through the kubelet's layout of its emptyDir rings volume
under ``--kubelet-root`` (the default webhook mode), else under ``--ring-root`` (the
legacy hostPath mode); see :mod:`.rings`.

Every ``--window-seconds`` it lists the pods bound to its node (the API server, a field
selector on ``spec.nodeName``), measures each (see :mod:`.daemon`) and posts the windows.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from elastico_extender.agent.daemon import WARMUP_SECONDS, Agent, PodInfo, pod_info
from elastico_extender.agent.reporter import Reporter
from elastico_extender.agent.rings import KUBELET_ROOT, PodRings
from elastico_extender.annotations import check_warmup_seconds
from elastico_extender.bearer import BearerToken
from elastico_extender.launcher.run import DEFAULT_RING_ROOT
from elastico_extender.profiling.hardware import HardwareSample, HardwareSource, detect_source

__all__ = ["kube_pods", "main", "parser"]

log = logging.getLogger(__name__)
MIN_WINDOW_SECONDS = 1.0
"""Shortest window of the daemon: each is one POST to the extender per node."""


def parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(
        prog="elastico agent",
        description="Observe this node's pods (shim rings, framework counters, DCGM/NVML) "
        "and report per-window progress to the ElastiCo extender.",
    )
    p.add_argument("--node", default=env.get("NODE_NAME"), help="this node (default $NODE_NAME)")
    p.add_argument(
        "--extender",
        default=env.get("ELASTICO_EXTENDER_URL"),
        help="extender URL (default $ELASTICO_EXTENDER_URL)",
    )
    p.add_argument(
        "--token-file",
        help="bearer token sent to the extender, re-read when the file changes: the agent's "
        "projected ServiceAccount token (the extender's agent_auth: serviceaccount) or the "
        "extender's own token (shared)",
    )
    p.add_argument("--ca-file", help="CA that signed the extender's certificate")
    p.add_argument("--client-cert", help="client certificate (mTLS listener)")
    p.add_argument("--client-key", help="client key (mTLS listener)")
    p.add_argument(
        "--kubelet-root",
        default=env.get("ELASTICO_KUBELET_ROOT", KUBELET_ROOT),
        help="the kubelet's root directory, whose pods/ holds each pod's emptyDir rings "
        f"volume (default $ELASTICO_KUBELET_ROOT, else {KUBELET_ROOT}; '' to not look there)",
    )
    p.add_argument(
        "--ring-root",
        default=env.get("ELASTICO_RING_ROOT", DEFAULT_RING_ROOT),
        help="shared host directory of the legacy hostPath mode, one directory per pod uid "
        f"(default $ELASTICO_RING_ROOT, else {DEFAULT_RING_ROOT}; '' to not look there)",
    )
    p.add_argument("--window-seconds", type=float, default=10.0, help="default %(default)s")
    p.add_argument(
        "--warmup-seconds",
        type=float,
        default=WARMUP_SECONDS,
        help="seconds after a run's first kernel launch that are not measured, for pods "
        "without elastico.io/warmup-seconds (default %(default)s)",
    )
    p.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster config)")
    p.add_argument("--once", action="store_true", help="report two windows and exit")
    return p


LIST_TIMEOUT_SECONDS = 10.0
"""Longest wait for each try of the pod listing (the client retries a read a few times):
an API server that accepts and never answers must not stop the agent's windows."""


def kube_pods(api: Any, node: str) -> list[PodInfo]:
    """Running pods bound to ``node``, as plain Pod JSON through the kubernetes client."""
    reply = api.list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={node}",
        _preload_content=False,
        _request_timeout=LIST_TIMEOUT_SECONDS,
    )
    items = json.loads(reply.data).get("items") or []
    found = []
    for pod in items:
        if (pod.get("spec") or {}).get("nodeName") != node:
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        info = pod_info(pod)
        if info is not None:
            found.append(info)
    return found


class DeviceMetrics:
    """One hardware source per GPU index, opened on first use."""

    def __init__(self) -> None:
        self._sources: dict[int, HardwareSource] = {}

    def __call__(self, device: int) -> HardwareSample | None:
        source = self._sources.get(device)
        if source is None:
            source = self._sources[device] = detect_source(os.environ, device)
        return source.sample()


def _is_http_url(url: str) -> bool:
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018  (raises ValueError when out of range)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _read_token(path: str | None, problems: list[str]) -> BearerToken | None:
    """The bearer token in ``path`` (None: no file given), re-read when the file is
    rotated; a problem when unusable at start."""
    if not path:
        return None
    try:
        return BearerToken.from_file(path)
    except ValueError as exc:
        problems.append(f"--token-file: {exc}")
        return None


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    problems = []
    if not args.node:
        problems.append("--node (or $NODE_NAME) is required")
    if not args.extender:
        problems.append("--extender (or $ELASTICO_EXTENDER_URL) is required")
    if bool(args.client_cert) != bool(args.client_key):
        problems.append("--client-cert and --client-key go together")
    if args.extender and not _is_http_url(args.extender):
        problems.append(f"--extender: {args.extender!r} is not a valid http:// or https:// URL")
    if not (math.isfinite(args.window_seconds) and args.window_seconds > 0):
        problems.append("--window-seconds must be a finite number > 0")
    elif args.window_seconds < MIN_WINDOW_SECONDS and not args.once:
        problems.append(
            f"--window-seconds must be >= {MIN_WINDOW_SECONDS:g} for the daemon (a report "
            "per window to the extender; --once may wait less)"
        )
    try:
        check_warmup_seconds(args.warmup_seconds)
    except ValueError as exc:
        problems.append(f"--warmup-seconds {exc}")
    if not args.kubelet_root and not args.ring_root:
        problems.append("--kubelet-root and --ring-root are both empty: no rings to read")
    for option in ("--token-file", "--ca-file", "--client-cert", "--client-key"):
        path = getattr(args, option[2:].replace("-", "_"))
        if path and not Path(path).is_file():
            problems.append(f"{option}: {path} is not a readable file")
    token = _read_token(args.token_file, problems) if not problems else None
    if problems:
        print("elastico agent: " + "; ".join(problems), file=sys.stderr)
        return 2
    if args.kubelet_root and not (Path(args.kubelet_root) / "pods").is_dir():
        log.warning(
            "agent.kubelet_root_without_pods: %s/pods is not a directory here: pods' emptyDir "
            "rings are not found (mount the kubelet's pods directory, or set --kubelet-root "
            "to the kubelet's --root-dir)",
            args.kubelet_root,
        )
    try:
        reporter = Reporter(
            args.extender,
            token=token,
            ca_file=args.ca_file,
            client_cert=(args.client_cert, args.client_key) if args.client_cert else None,
        )
    except OSError as exc:  # ssl.SSLError included: a file that is not PEM
        print(
            f"elastico agent: --ca-file/--client-cert/--client-key: cannot load: {exc}",
            file=sys.stderr,
        )
        return 2
    from kubernetes import client
    from kubernetes.config import ConfigException

    from elastico_extender.cluster.kube import api_client_from

    try:
        core = client.CoreV1Api(api_client_from(args.kubeconfig))
    except (ConfigException, OSError, ValueError) as exc:
        reporter.close()
        source = (
            f"--kubeconfig {args.kubeconfig}"
            if args.kubeconfig
            else "in-cluster config (outside a pod, pass --kubeconfig)"
        )
        print(f"elastico agent: cannot start: {source}: {exc}", file=sys.stderr)
        return 1
    rings = PodRings(args.ring_root or None, kubelet_root=args.kubelet_root or None)
    agent = Agent(
        args.node,
        lambda: kube_pods(core, args.node),
        rings,
        reporter,
        hardware=DeviceMetrics(),
        warmup_seconds=args.warmup_seconds,
    )
    try:
        if args.once:
            try:
                agent.observe()  # baseline
                threading.Event().wait(args.window_seconds)
                result = agent.run_once()
                print(json.dumps(result))
                # a check run: the daemon goes on after a failed window, --once says so
                failure = agent.listing_error or result.get("error")
            except Exception as exc:  # one line, as the daemon loop logs it and goes on
                failure = str(exc)
            if failure:
                print(f"elastico agent: window failed: {failure}", file=sys.stderr)
                return 1
            return 0
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        log.info(
            "agent.started",
            extra={"node": args.node, "kubelet_root": args.kubelet_root, "rings": args.ring_root},
        )
        agent.run(args.window_seconds, stop)
        return 0
    finally:
        rings.close()
        reporter.close()
