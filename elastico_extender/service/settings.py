"""Service settings: every default in one place, with its unit and why (STYLE habit 6).

Precedence, lowest first: these defaults, a settings file (``--config``, JSON
or YAML with these field names), environment variables ``ELASTICO_<FIELD>``
(upper case), command-line flags.  :meth:`ServiceSettings.problems` returns
every invalid field with its name, not only the first.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from elastico_extender.cluster.objects import quantity
from elastico_extender.core.settings import PlannerSettings, coerce_fields
from elastico_extender.userfiles import YamlError, parse_yaml, read_text, reason

__all__ = [
    "ENV_PREFIX",
    "MAX_SETTINGS_FILE_BYTES",
    "MIN_EPOCH_SECONDS",
    "PLANNER",
    "ServiceSettings",
]

ENV_PREFIX = "ELASTICO_"
PLANNER = "planner"
"""The nested section of planner settings: ``planner: {tau_default: 1.4}`` in the file,
``ELASTICO_PLANNER_TAU_DEFAULT`` in the environment, ``--planner tau_default=1.4``."""
MIN_EPOCH_SECONDS = 0.5
"""Shortest epoch_seconds: a plan of the whole cluster each time (seconds at 10,000 pods)."""
MAX_SETTINGS_FILE_BYTES = 1 << 20
"""Largest ``--config`` file read (a settings file is a few KiB)."""


@dataclass(frozen=True)
class ServiceSettings:
    # --- listeners -------------------------------------------------------
    host: str = "127.0.0.1"
    """Address to listen on; loopback by default, the Deployment passes 0.0.0.0."""
    port: int = 8888
    """Extender + REST port (kube-scheduler's urlPrefix points here)."""
    webhook_port: int | None = None
    """Optional second TLS listener for the mutating webhook (the API server presents no
    client certificate, so it cannot share a listener that requires one). None: the
    webhook is served on ``port``."""
    views_port: int | None = None
    """Optional TLS listener (server certificate only, no client certificate) for
    readers without the scheduler's certificate: the read-only REST views, /metrics,
    /docs, the health probes and ``POST /observations`` with the bearer token (the
    node agents).  No verb, no /mutate (api.listeners).  The chart uses 8444.  None or
    0: off."""
    tls_cert: str | None = None
    tls_key: str | None = None
    """PEM server certificate and key; both or neither."""
    client_ca_file: str | None = None
    """PEM CA: when set, ``port`` requires a client certificate signed by it (mTLS); the
    kube-scheduler presents one through the extender's ``tlsConfig``, and requests on
    that listener count as authenticated."""
    client_cert_names: str = "elastico-scheduler"
    """Comma-separated names (subject CN or DNS/URI subjectAltName) of client
    certificates that may bind without the bearer token on the mTLS port: the
    kube-scheduler's.  Other certificates of ``client_ca_file`` need the token."""
    agent_cert_names: str = "elastico-agent"
    """Comma-separated names (CN or DNS/URI subjectAltName) of client certificates that
    may post observations without the token on the mTLS port: the node agents' (with
    ``agent_auth: shared`` only).  They may not bind: each identity gets only its own
    endpoints (least privilege)."""
    agent_auth: str = "shared"
    """How node agents authenticate ``POST /observations``.  ``shared``: the bearer token
    (``token_file``) or a certificate named in ``agent_cert_names``, one credential for
    every node, so it speaks for any node.  ``serviceaccount``: each agent's projected
    ServiceAccount token, reviewed by the API server (TokenReview), which binds it to the
    agent's node: an agent may report only the pods of its own node (needs a Kubernetes
    cluster; docs/observability.md).  The chart uses ``serviceaccount``."""
    agent_token_audience: str = "elastico-extender"
    """The audience the agents' projected tokens are issued for (``serviceaccount``)."""
    agent_service_account: str = "elastico-system:elastico-agent"
    """``NAMESPACE:NAME`` of the agents' ServiceAccount (``serviceaccount``): a token of any
    other account is refused."""
    token_file: str | None = None
    """File holding the bearer token for state-changing endpoints (bind, POST /epoch).
    None: a random token is generated at start-up and logged once."""
    max_body_bytes: int = 64 * 2**20
    """Largest request body accepted, bytes. A filter body with nodeCacheCapable off
    carries every node (about 5 KiB each with managedFields): 64 MiB covers ~10k nodes."""
    body_timeout_seconds: float = 30.0
    """Longest a request body may take to arrive once its headers have (408 after): a
    client that declares a length and sends less would otherwise hold a connection and
    a handler for ever."""
    # --- cluster ---------------------------------------------------------
    kubeconfig: str | None = None
    """Path of a kubeconfig; None: in-cluster config when running in a pod."""
    embedded: str | None = None
    """Path of a v1 List of Node/Pod objects to serve instead of a real cluster; used
    (with the packaged file) when no cluster is configured."""
    embedded_state: str | None = None
    """File where the embedded cluster keeps its objects (pods bound, their decisions,
    ConfigMaps) across restarts, ``kill -9`` included; None: in memory only, every bind
    is forgotten when the process ends (docs/embedded.md)."""
    scheduler_name: str = "elastico-scheduler"
    """Pending pods of this schedulerName take part in planning ('' = every scheduler)."""
    default_gpu_memory_mib: float = 40960.0
    """Per-GPU memory, MiB, of nodes without the ``nvidia.com/gpu.memory`` GFD label
    (A100-SXM4-40GB, the spec's testbed)."""
    resync_seconds: float = 300.0
    """Full relist period of the watch, seconds (on top of relists after 410/drops)."""
    watch_timeout_seconds: int = 60
    """Server-side timeout of one watch request (``timeoutSeconds``), seconds: the API
    server ends the stream then and the watch resumes from its last version.  Short,
    because only a stream's end shows a quiet connection is alive (``cluster.kube``)."""
    watch_grace_seconds: float = 15.0
    """How long a watch may stay silent past its ``timeoutSeconds`` before the connection
    is taken for dead (a proxy or load balancer that lost its upstream) and replaced by a
    relist, seconds: a stalled watch is noticed within ``watch_timeout_seconds`` plus this
    (75 s by default)."""
    # --- scheduling ------------------------------------------------------
    epoch_seconds: float = 5.0
    """Delta T of the background planning loop, seconds (spec 3.4 default)."""
    assume_ttl_seconds: float = 60.0
    """How long a bound-but-unconfirmed placement counts against capacity, seconds; the
    watch normally confirms it within a second."""
    require_webhook: bool = True
    """An opted-in pod shares GPUs only if the mutating webhook admitted it (its
    ``elastico-decision`` volume is there): without the webhook's env and decision file
    nothing inside the pod enforces a budget, so such a pod (created while the webhook
    was down, failurePolicy Ignore) may only take whole idle GPUs.  False: trust every
    opted-in pod (a cluster that injects the env another way)."""
    min_dwell_seconds: float = 60.0
    """A pod bound (or reconfigured) less than this long ago keeps its configuration:
    every reshape restarts the workload (spec 5.7's restart cost), so no epoch reshapes
    a job that has just started.  0: no dwell."""
    price_history: int = 120
    """Epochs of price history kept for GET /prices (10 minutes at 5 s)."""
    max_migrations_per_epoch: int = 1
    """Pods the extender may evict per epoch to carry out the plan's moves (MIGRATE),
    among pods annotated ``elastico.io/migration: allowed`` that a controller owns;
    0: moves are only logged."""
    profile_store: str | None = None
    """SQLite profile store whose measured rows override the catalog (None: catalog only)."""
    observation_store: str | None = None
    """SQLite file for what the closed loop learns (solo reference rates, labelled pair
    samples; issue 11). None: the profile store's file when one is set, else memory only
    (lost at restart, and said so at start-up)."""
    observation_max_age_seconds: float = 120.0
    """A node agent's window that ended longer ago than this is refused (422), seconds:
    two default epochs' worth of delay is a broken agent or clock, not news."""
    observation_max_skew_seconds: float = 30.0
    """How far in the future (agent clock ahead of ours) a window may end, seconds."""
    observation_stale_seconds: float = 60.0
    """A running pod whose last report is older than this shows as stale (REST, metric);
    its last observation and the plan's decisions stay as they are, seconds."""
    predictor_model: str | None = None
    """ONNX interference model; None: the model shipped with the package; ``heuristic``:
    the contention heuristic, chosen (``service.predictor.HEURISTIC``).  A model that
    cannot be loaded leaves the service up on the contention heuristic, reported as
    degraded (``/healthz``, ``elastico_predictor_degraded``)."""
    mps: bool = True
    """Emit CUDA_MPS_* limits in the hand-off (spec 4.2 iii)."""
    # -- the profiler shim's rings in opted-in pods (webhook; docs/observability.md) ----
    rings_volume: str = "emptyDir"
    """What the webhook mounts at /run/elastico/rings for the shim's rings: ``emptyDir``
    (allowed at every Pod Security level; the node agent reads it through the kubelet's
    pods directory) or ``hostPath`` (the legacy shared host directory ``rings_host_path``,
    which the Pod Security ``baseline`` and ``restricted`` levels refuse)."""
    rings_medium: str = "Memory"
    """emptyDir medium: ``Memory`` (tmpfs, like /run; its pages count against the pod's
    memory) or ``""`` (the node's disk, with its write-back)."""
    rings_size_limit: str = "256Mi"
    """emptyDir sizeLimit (a quantity; ``""``: none).  Each profiled process maps one 4 MiB
    ring (``ELASTICO_SHIM_BUFFER_BYTES``), so 256Mi holds 63; a process whose ring does not
    fit runs unprofiled, it is not killed."""
    rings_host_path: str = "/run/elastico/rings"
    """Host directory of the ``hostPath`` mode (the agent's ``--ring-root``)."""
    log_level: str = "info"
    log_format: str = "text"
    """``text``: one line per event with ``key=value`` fields; ``json``: one JSON object
    per line (service.logs)."""
    # -- high availability (service/leader.py): Lease-based leader election ------------
    leader_election: bool = False
    """Run as one of several replicas: only the Lease holder plans, binds and writes."""
    lease_name: str = "elastico-extender"
    lease_namespace: str = "elastico-system"
    identity: str = ""
    """This replica's holderIdentity (the chart sets the pod name; default: host name)."""
    lease_duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0
    # -- the learned-state checkpoint (service/checkpoint.py) -----------------------------
    learned_checkpoint: bool = True
    """On a Kubernetes cluster, the leader checkpoints what the closed loop learned to a
    ConfigMap and every replica restores it at start and when it becomes the leader."""
    learned_configmap: str = "elastico-learned"
    learned_namespace: str = ""
    """The checkpoint's namespace; empty: ``lease_namespace`` (the extender's)."""
    learned_checkpoint_seconds: float = 30.0
    """How often at most the leader writes the checkpoint (also once at a clean stop)."""
    learned_checkpoint_max_bytes: int = 786_432
    """Bound of the compressed checkpoint (768 KiB; a ConfigMap holds at most 1 MiB):
    the oldest rows are dropped first, and the ConfigMap says how many."""

    # -- the planner (core/settings.py: ESP, IAC, PDS, queueing, the closed loop) ------
    planner: PlannerSettings = field(default_factory=PlannerSettings)
    """Every planner setting (tolerance tau, switching cost, queue bands, tau's load
    average, ...), a nested mapping of ``elastico_extender/core/settings.py``'s field
    names; unset fields keep those defaults, which the simulator's results were measured
    with (docs/service.md, "Planner settings")."""

    @property
    def allowed_client_names(self) -> tuple[str, ...]:
        return _names(self.client_cert_names)

    @property
    def allowed_agent_names(self) -> tuple[str, ...]:
        return _names(self.agent_cert_names)

    # -- construction --------------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def load(
        cls,
        file: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> ServiceSettings:
        """Defaults < file < environment < overrides (flags); raises ValueError listing
        every problem."""
        values: dict[str, Any] = {}
        problems: list[str] = []
        if file is not None:
            try:
                text = read_text(file, MAX_SETTINGS_FILE_BYTES)
            except OSError as exc:
                raise ValueError(f"{file}: cannot read: {reason(exc)}") from None
            try:
                doc = json.loads(text)
            except json.JSONDecodeError:
                try:
                    doc = parse_yaml(text)
                except YamlError as exc:
                    where = f"line {exc.line}: " if exc.line is not None else ""
                    why = exc.problem or "unreadable"
                    raise ValueError(f"{file}: neither JSON nor YAML ({where}{why})") from None
            if not isinstance(doc, dict):
                raise ValueError(f"{file}: settings file must hold a mapping")
            values.update(doc)
        env = os.environ if env is None else env
        planner = {**_mapping(values.pop(PLANNER, None), problems)}
        planner.update(_planner_env(env))
        planner.update(_mapping((overrides or {}).get(PLANNER), problems))
        for name in cls.field_names():
            key = ENV_PREFIX + name.upper()
            if key in env and name != PLANNER:
                values[name] = env[key]
        values.update({k: v for k, v in (overrides or {}).items() if v is not None})
        values.pop(PLANNER, None)
        coerced, found = coerce_fields(cls, values)
        problems.extend(found)
        try:
            coerced[PLANNER] = PlannerSettings.from_mapping(planner, label=PLANNER + ".")
        except ValueError as exc:
            problems.append(str(exc))
        settings = replace(cls(), **coerced)
        problems.extend(settings.problems())
        if problems:
            raise ValueError("invalid settings: " + "; ".join(problems))
        return settings

    def problems(self) -> list[str]:
        found = []
        if not 0 < self.port < 65536:
            found.append(f"port: must be 1..65535, got {self.port}")
        if self.webhook_port is not None and not 0 < self.webhook_port < 65536:
            found.append(f"webhook_port: must be 1..65535, got {self.webhook_port}")
        if self.views_port and not 0 < self.views_port < 65536:
            found.append(f"views_port: must be 1..65535 or 0 (off), got {self.views_port}")
        ports = [self.port, self.webhook_port, self.views_port or None]
        taken = [p for p in ports if p is not None]
        if len(set(taken)) != len(taken):
            found.append(f"port/webhook_port/views_port: must differ, got {ports}")
        if (self.tls_cert is None) != (self.tls_key is None):
            found.append("tls_cert/tls_key: give both or neither")
        if self.client_ca_file and not self.tls_cert:
            found.append("client_ca_file: needs tls_cert and tls_key")
        if self.webhook_port is not None and not self.tls_cert:
            found.append("webhook_port: the API server only calls webhooks over TLS")
        if 0 < self.epoch_seconds < MIN_EPOCH_SECONDS:
            found.append(
                f"epoch_seconds: must be >= {MIN_EPOCH_SECONDS:g} s (an epoch plans the whole "
                "cluster; shorter ones only keep the leader's CPU busy)"
            )
        if self.watch_timeout_seconds < 1:
            found.append(f"watch_timeout_seconds: must be >= 1 s, got {self.watch_timeout_seconds}")
        for name in (
            "epoch_seconds",
            "assume_ttl_seconds",
            "resync_seconds",
            "watch_grace_seconds",
            "observation_max_age_seconds",
            "observation_max_skew_seconds",
            "observation_stale_seconds",
        ):
            if not 0 < getattr(self, name) < math.inf:
                found.append(f"{name}: must be a finite number > 0 seconds")
        if not 0 < self.learned_checkpoint_seconds < math.inf:
            found.append("learned_checkpoint_seconds: must be a finite number > 0 seconds")
        if not 4096 <= self.learned_checkpoint_max_bytes <= 900 * 1024:
            found.append(
                "learned_checkpoint_max_bytes: must be 4096..921600 (a ConfigMap holds at "
                "most 1 MiB, with its metadata)"
            )
        if self.max_body_bytes < 1024:
            found.append("max_body_bytes: must be >= 1024")
        if not 0 < self.body_timeout_seconds < math.inf:
            found.append("body_timeout_seconds: must be a finite number > 0 seconds")
        if not 0 < self.default_gpu_memory_mib < math.inf:
            found.append("default_gpu_memory_mib: must be > 0")
        if self.min_dwell_seconds < 0:
            found.append("min_dwell_seconds: must be >= 0 seconds")
        if self.price_history < 1:
            found.append("price_history: must be >= 1")
        if self.max_migrations_per_epoch < 0:
            found.append("max_migrations_per_epoch: must be >= 0")
        if not (
            0 < self.retry_period_seconds < self.renew_deadline_seconds
            and self.renew_deadline_seconds < self.lease_duration_seconds
        ):
            found.append(
                "lease_duration_seconds > renew_deadline_seconds > retry_period_seconds > 0 "
                "is required (a leader must give up before another may take over)"
            )
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            found.append("log_level: must be debug, info, warning or error")
        found.extend(self._rings_problems())
        found.extend(self._agent_problems())
        found.extend(f"{PLANNER}.{problem}" for problem in self.planner.problems())
        if self.log_format not in ("text", "json"):
            found.append(f"log_format: must be text or json, got {self.log_format!r}")
        if not self.host.strip():
            found.append("host: must not be empty (0.0.0.0 listens on every interface)")
        return found

    def _agent_problems(self) -> list[str]:
        if self.agent_auth not in ("shared", "serviceaccount"):
            return [f"agent_auth: must be shared or serviceaccount, got {self.agent_auth!r}"]
        if self.agent_auth != "serviceaccount":
            return []
        found = []
        if not self.agent_token_audience.strip():
            found.append("agent_token_audience: must not be empty")
        if not re.fullmatch(r"[a-z0-9.-]{1,253}:[a-z0-9.-]{1,253}", self.agent_service_account):
            found.append(
                "agent_service_account: must be NAMESPACE:NAME of the agents' ServiceAccount, "
                f"got {self.agent_service_account[:100]!r}"
            )
        return found

    def _rings_problems(self) -> list[str]:
        found = []
        if self.rings_volume not in ("emptyDir", "hostPath"):
            found.append(f"rings_volume: must be emptyDir or hostPath, got {self.rings_volume!r}")
        if self.rings_medium not in ("", "Memory"):
            found.append(f"rings_medium: must be Memory or empty, got {self.rings_medium!r}")
        if self.rings_size_limit:
            try:
                size = quantity(self.rings_size_limit)
            except ValueError as exc:
                found.append(f"rings_size_limit: {exc}")
            else:
                if size < 2**20:
                    found.append("rings_size_limit: must be at least 1Mi (or empty: none)")
        if not self.rings_host_path.startswith("/") or ".." in self.rings_host_path.split("/"):
            found.append(f"rings_host_path: must be an absolute path, got {self.rings_host_path!r}")
        return found


def _mapping(raw: Any, problems: list[str]) -> Mapping[str, Any]:
    """The ``planner`` section as given (None: empty); anything but a mapping is a problem."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        kind = type(raw).__name__
        problems.append(f"{PLANNER}: must be a mapping of planner settings, got {kind}")
        return {}
    return raw


def _planner_env(env: Mapping[str, str]) -> dict[str, str]:
    """Planner settings from ``ELASTICO_PLANNER_<FIELD>`` variables."""
    prefix = f"{ENV_PREFIX}{PLANNER.upper()}_"
    names = {f.name for f in fields(PlannerSettings)}
    return {
        key[len(prefix) :].lower(): value
        for key, value in env.items()
        if key.startswith(prefix) and key[len(prefix) :].lower() in names
    }


def _names(listed: str) -> tuple[str, ...]:
    """A comma-separated list of certificate names, blanks dropped."""
    return tuple(n.strip() for n in listed.split(",") if n.strip())
