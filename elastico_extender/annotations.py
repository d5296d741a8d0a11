"""The ``elastico.io/`` pod annotations: how a pod opts in, and how decisions are written back.

Input annotations (set by the user; any one of them opts the pod in)::

    elastico.io/family          workload family, the profile key (required), e.g. ``bert``
    elastico.io/mode            ``elastic`` (default: ElastiCo picks the configuration)
                                or ``fixed`` (the pod keeps one configuration)
    elastico.io/kind            ``training`` | ``inference``; optional, must match the family
    elastico.io/min-throughput  floor L_j in the family's unit (samples/s or tokens/s), >= 0
    elastico.io/weight          priority weight w_j, a positive number (default 1)
    elastico.io/allowed         allowed knob ranges, ``;``-separated: ``knob=low..high``
                                (inclusive, numeric) or ``knob=v1|v2`` (a set of values),
                                e.g. ``batch_size=32..128; amp=on``
    elastico.io/configuration   ``fixed`` mode only: the configuration to run,
                                ``knob=value,knob=value`` (unset knobs: the fastest row's)
    elastico.io/migration       ``allowed``: when the plan moves the pod to other GPUs
                                the extender evicts it (Eviction API, PodDisruptionBudgets
                                apply) so its controller recreates it; ``never``
                                (default): a move is only logged
    elastico.io/profiling       ``true``: ``elastico-run`` preloads the profiler shim
                                (read in the container; does not opt a pod in by itself)

Decision annotations (written by bind and by every in-place reconfiguration; read
back to rebuild state after a restart, and by ``elastico-run`` in the container
through the downward-API file)::

    elastico.io/assigned-node, assigned-devices (host GPU indices, ``0,1``),
    assigned-configuration (the configuration label), assigned-knobs (JSON),
    workload-kind, memory-budget-mib, device-memory-mib, sm-share, mps,
    predicted-slowdown, price-epoch, configmap (the per-pod ConfigMap holding the
    framework settings)

:func:`parse_intent` validates everything and raises :class:`AnnotationError`
with every ``(annotation, message)`` pair, so the pod's event lists all fixes.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from elastico_extender.core.handoff import memory_share
from elastico_extender.core.model import (
    Configuration,
    JobKind,
    KnobValue,
    Mode,
    ProfileFamily,
)
from elastico_extender.core.shapes.knobs import KnobRange, KnobSpace
from elastico_extender.errors import AnnotationError, UnknownWorkloadError

__all__ = [
    "ANNOTATIONS_FILE",
    "ANNOTATIONS_FILE_ENV",
    "DECISION_DIR",
    "DECISION_KEYS",
    "DECISION_VOLUME",
    "INPUT_KEYS",
    "LAUNCHED_CONFIGURATION_FILE",
    "MAX_WARMUP_SECONDS",
    "PREFIX",
    "PROGRESS_METRICS",
    "RINGS_DIR",
    "RINGS_VOLUME",
    "USER_SETTINGS_ENV",
    "WARMUP",
    "Decision",
    "PodIntent",
    "ProgressEndpoint",
    "check_warmup_seconds",
    "configmap_name",
    "decision_annotations",
    "device_indices",
    "family_knob_space",
    "is_opted_in",
    "parse_intent",
    "parse_progress_metrics",
    "parse_warmup_seconds",
    "read_decision",
]

PREFIX = "elastico.io/"

# Where the container finds the decision: the webhook mounts the pod's annotations
# (downward API) at DECISION_DIR and sets ANNOTATIONS_FILE_ENV to the file, which is
# what elastico-run reads (and its default); one name, defined once, for both sides.
# The volume's presence on a pod is also how the extender knows the webhook admitted it.
DECISION_VOLUME = "elastico-decision"
DECISION_DIR = "/etc/elastico"
ANNOTATIONS_FILE = f"{DECISION_DIR}/annotations"
ANNOTATIONS_FILE_ENV = "ELASTICO_ANNOTATIONS_FILE"
# The settings a container sets itself (its own env entries the webhook leaves as written),
# comma-separated: elastico-run keeps the user's value for those instead of the decision's,
# since at run time a user's value and the ConfigMap's look alike in the environment.
USER_SETTINGS_ENV = "ELASTICO_USER_SETTINGS"

# Where the profiler shim's rings go (issue 11; docs/observability.md): the webhook
# mounts the volume RINGS_VOLUME at RINGS_DIR in the container and sets
# ELASTICO_RING_ROOT to it; elastico-run writes under RINGS_DIR/<pod uid>/; the node
# agent finds that directory on the host through the kubelet's layout of the pod's
# emptyDir named RINGS_VOLUME (or, in the legacy hostPath mode, under the host path).
RINGS_VOLUME = "elastico-rings"
RINGS_DIR = "/run/elastico/rings"
# Beside a container's rings elastico-run keeps, in this file, the assigned configuration
# (the ASSIGNED_CONFIGURATION annotation) its workload runs under, so the node agent can
# tell a window measured before a new decision reached the workload (agent/daemon.py).
LAUNCHED_CONFIGURATION_FILE = "elastico-configuration"

FAMILY = "family"
MODE = "mode"
KIND = "kind"
MIN_THROUGHPUT = "min-throughput"
WEIGHT = "weight"
ALLOWED = "allowed"
CONFIGURATION = "configuration"
MIGRATION = "migration"
PROFILING = "profiling"  # read by elastico-run in the container (launcher.assignment)
PROGRESS_METRICS = "progress-metrics"  # read by elastico agent: PORT/PATH#COUNTER[@UNIT]
WARMUP = "warmup-seconds"  # read by elastico agent: seconds of a run not measured
INPUT_KEYS = (
    FAMILY,
    MODE,
    KIND,
    MIN_THROUGHPUT,
    WEIGHT,
    ALLOWED,
    CONFIGURATION,
    MIGRATION,
    PROGRESS_METRICS,
    WARMUP,
)
# Accepted on a pod without being an opt-in: the container's own switches.
CONTAINER_KEYS = (PROFILING,)

ASSIGNED_NODE = "assigned-node"
ASSIGNED_DEVICES = "assigned-devices"
ASSIGNED_CONFIGURATION = "assigned-configuration"
MEMORY_BUDGET = "memory-budget-mib"
PREDICTED_SLOWDOWN = "predicted-slowdown"
PRICE_EPOCH = "price-epoch"
CONFIGMAP = "configmap"
# Read back inside the container by elastico-run (launcher.assignment) through the
# downward-API file, so a reconfiguration reaches the workload without a new pod.
WORKLOAD_KIND = "workload-kind"
ASSIGNED_KNOBS = "assigned-knobs"  # JSON object: exact knob values and types
DEVICE_MEMORY = "device-memory-mib"
SM_SHARE = "sm-share"
MPS = "mps"
DECISION_KEYS = (
    WORKLOAD_KIND,
    ASSIGNED_KNOBS,
    DEVICE_MEMORY,
    SM_SHARE,
    MPS,
    ASSIGNED_NODE,
    ASSIGNED_DEVICES,
    ASSIGNED_CONFIGURATION,
    MEMORY_BUDGET,
    PREDICTED_SLOWDOWN,
    PRICE_EPOCH,
    CONFIGMAP,
)

_TRUE = {"true", "on", "yes", "1"}
_FALSE = {"false", "off", "no", "0"}

_COUNTER = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*$")
_UNIT = re.compile(r"^[A-Za-z0-9_.:]{1,32}/s$")
_URL_PATH = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@%/?-]*\Z")
"""What a scrape's request line may hold (RFC 3986 path and query characters): the agent
could never fetch another path, so admission refuses it where the user sees why."""


@dataclass(frozen=True)
class ProgressEndpoint:
    """A pod's framework progress counter (``elastico.io/progress-metrics``), e.g.
    ``8000/metrics#vllm:generation_tokens_total@tokens/s``: a Prometheus counter on the
    pod's IP whose rate is the job's progress (summed over its label sets)."""

    port: int
    path: str
    counter: str
    unit: str


def parse_progress_metrics(text: str) -> ProgressEndpoint:
    """Parse ``PORT[/PATH]#COUNTER[@UNIT]``; ValueError saying what is wrong."""
    where, sep, rest = text.strip().partition("#")
    if not sep or not rest:
        raise ValueError(f"expected PORT[/PATH]#COUNTER[@UNIT], got {text!r}")
    port_text, slash, path = where.partition("/")
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
        raise ValueError(f"port must be 1..65535, got {port_text!r}")
    if not _URL_PATH.match(path):
        raise ValueError(f"path must be URL path characters (no space or control), got {path!r}")
    counter, at, unit = rest.partition("@")
    if not _COUNTER.match(counter):
        raise ValueError(f"not a Prometheus metric name: {counter!r}")
    if not at:
        unit = "tokens/s" if "token" in counter else "items/s"
    if not _UNIT.match(unit):
        raise ValueError(f"unit must look like tokens/s (at most 32 characters), got {unit!r}")
    return ProgressEndpoint(int(port_text), "/" + path if slash else "/metrics", counter, unit)


MAX_WARMUP_SECONDS = 3600.0
"""Longest warm-up a pod may declare: an hour covers a compiled model's first steps; a
longer one would leave the pod unmeasured, and so unprotected, for longer."""


def check_warmup_seconds(value: float) -> float:
    """``value`` if it is a warm-up a pod or the agent may have (0 to
    ``MAX_WARMUP_SECONDS``); ValueError saying what is wrong."""
    if not 0 <= value <= MAX_WARMUP_SECONDS:  # NaN fails both
        raise ValueError(f"must be between 0 and {MAX_WARMUP_SECONDS:g} seconds, got {value:g}")
    return value


def parse_warmup_seconds(text: str) -> float:
    """Parse ``elastico.io/warmup-seconds`` (seconds after a run's first kernel launch that
    are not measured: compilation, autotuning); ValueError saying what is wrong."""
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"must be a number of seconds, got {text!r}") from None
    return check_warmup_seconds(value)


FamilyResolver = Callable[[str], ProfileFamily]
"""Returns the profile family for a name; raises :class:`UnknownWorkloadError` when none."""
UnprofiledResolver = Callable[[str, JobKind], ProfileFamily]
"""Returns the unprofiled family of a workload name the catalog lacks, for a kind."""


@dataclass(frozen=True)
class PodIntent:
    """What an opted-in pod asks for, validated against its profile family."""

    family: ProfileFamily = field(repr=False)
    mode: Mode
    kind: JobKind
    min_throughput: float
    weight: float
    allowed: tuple[int, ...] | None  # configuration rows; None = every row
    migration_allowed: bool = False  # elastico.io/migration: allowed

    @property
    def family_name(self) -> str:
        return self.family.workload


@dataclass(frozen=True)
class Decision:
    """A bind decision as recorded on the pod."""

    node: str
    devices: tuple[int, ...]
    configuration: str
    memory_budget_mib: float


def _key(name: str) -> str:
    return PREFIX + name


def is_opted_in(annotations: Mapping[str, str] | None) -> bool:
    """Whether any input annotation is present (decision keys alone do not opt in)."""
    if not annotations:
        return False
    return any(_key(k) in annotations for k in INPUT_KEYS)


@functools.lru_cache(maxsize=256)  # families hash by identity; every pod of one reads it
def family_knob_space(family: ProfileFamily) -> KnobSpace:
    """The knob space spanned by a family's configurations (values in first-seen order)."""
    values: dict[str, list[KnobValue]] = {}
    for config in family.configs:
        for name, value in config.knobs:
            seen = values.setdefault(name, [])
            if value not in seen:
                seen.append(value)
    return KnobSpace.of(**values)


def _match_value(token: str, candidates: tuple[KnobValue, ...]) -> KnobValue | None:
    """The knob value written as ``token`` (bools as on/off/true/false, numbers by value)."""
    text = token.strip().lower()
    for value in candidates:
        if isinstance(value, bool):
            if (value and text in _TRUE) or (not value and text in _FALSE):
                return value
        elif isinstance(value, int | float):
            try:
                if math.isclose(float(text), float(value), rel_tol=1e-9, abs_tol=1e-12):
                    return value
            except ValueError:
                continue
        elif text == str(value).lower():
            return value
    return None


def _number(key: str, raw: str, problems: list[tuple[str, str]]) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        problems.append((key, f"must be a number, got {raw!r}"))
        return None
    if not math.isfinite(value):
        problems.append((key, f"must be a finite number, got {raw!r}"))
        return None
    return value


def _parse_allowed(
    raw: str, space: KnobSpace, problems: list[tuple[str, str]]
) -> dict[str, KnobRange]:
    key = _key(ALLOWED)
    knobs = {k.name: k for k in space.knobs}
    ranges: dict[str, KnobRange] = {}
    for part in (p.strip() for p in raw.split(";")):
        if not part:
            continue
        name, sep, spec = part.partition("=")
        name, spec = name.strip(), spec.strip()
        if not sep or not name or not spec:
            problems.append((key, f"{part!r} is not of the form knob=low..high or knob=a|b"))
            continue
        knob = knobs.get(name)
        if knob is None:
            problems.append((key, f"unknown knob {name!r}; known: {', '.join(space.names)}"))
            continue
        if name in ranges:
            problems.append((key, f"knob {name!r} is given twice"))
            continue
        if ".." in spec:
            low_text, _, high_text = spec.partition("..")
            try:
                low, high = float(low_text), float(high_text)
            except ValueError:
                problems.append((key, f"{name}: range {spec!r} needs two numbers"))
                continue
            if not (math.isfinite(low) and math.isfinite(high)) or low > high:
                problems.append((key, f"{name}: range {spec!r} is empty or not finite"))
                continue
            if not any(isinstance(v, int | float) and not isinstance(v, bool) for v in knob.values):
                problems.append((key, f"{name}: not a numeric knob; list values with a|b"))
                continue
            ranges[name] = (low, high)
            continue
        chosen: set[KnobValue] = set()
        for token in spec.split("|"):
            value = _match_value(token, knob.values)
            if value is None:
                shown = ", ".join(str(v) for v in knob.values)
                problems.append((key, f"{name}: {token.strip()!r} is not one of {shown}"))
            else:
                chosen.add(value)
        if chosen:
            ranges[name] = frozenset(chosen)
    return ranges


def _parse_configuration(
    raw: str, family: ProfileFamily, space: KnobSpace, problems: list[tuple[str, str]]
) -> int | None:
    key = _key(CONFIGURATION)
    wanted = dict(family.configs[family.fastest_index].knobs)
    knobs = {k.name: k for k in space.knobs}
    ok = True
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        name, sep, text = part.partition("=")
        name = name.strip()
        knob = knobs.get(name)
        if not sep or knob is None:
            problems.append((key, f"{part!r}: expected knob=value with a knob of {space.names}"))
            ok = False
            continue
        value = _match_value(text, knob.values)
        if value is None:
            shown = ", ".join(str(v) for v in knob.values)
            problems.append((key, f"{name}: {text.strip()!r} is not one of {shown}"))
            ok = False
            continue
        wanted[name] = value
    if not ok:
        return None
    try:
        return family.index_of(wanted)
    except KeyError:
        problems.append((key, f"{Configuration.from_dict(wanted).label} is not in the family"))
        return None


def parse_intent(
    annotations: Mapping[str, str] | None,
    resolve: FamilyResolver,
    unprofiled: UnprofiledResolver | None = None,
) -> PodIntent | None:
    """The pod's request, or None when it has not opted in.

    Raises :class:`AnnotationError` listing every invalid annotation (unknown
    keys under the prefix included, so a typo is reported, not ignored).  A
    family ``resolve`` does not know is an error unless ``unprofiled`` is given
    and the pod declares its kind: then it is an unprofiled workload (runs alone
    until measured; ``service/families.py``).
    """
    if not is_opted_in(annotations):
        return None
    assert annotations is not None
    problems: list[tuple[str, str]] = []
    known = {_key(k) for k in INPUT_KEYS + DECISION_KEYS + CONTAINER_KEYS}
    for key in annotations:
        if key.startswith(PREFIX) and key not in known:
            problems.append(
                (key, f"unknown annotation; known: {', '.join(_key(k) for k in INPUT_KEYS)}")
            )

    def get(name: str) -> str | None:
        value = annotations.get(_key(name))
        return None if value is None else str(value).strip()

    mode = Mode.ELASTIC
    raw_mode = get(MODE)
    if raw_mode is not None:
        try:
            mode = Mode(raw_mode.lower())
        except ValueError:
            problems.append((_key(MODE), f"must be elastic or fixed, got {raw_mode!r}"))
    kind: JobKind | None = None
    raw_kind = get(KIND)
    if raw_kind is not None:
        try:
            kind = JobKind(raw_kind.lower())
        except ValueError:
            problems.append((_key(KIND), f"must be training or inference, got {raw_kind!r}"))
    weight = 1.0
    raw_weight = get(WEIGHT)
    if raw_weight is not None:
        value = _number(_key(WEIGHT), raw_weight, problems)
        if value is not None and value <= 0:
            problems.append((_key(WEIGHT), f"must be > 0, got {raw_weight!r}"))
        elif value is not None:
            weight = value
    floor = 0.0
    raw_floor = get(MIN_THROUGHPUT)
    if raw_floor is not None:
        value = _number(_key(MIN_THROUGHPUT), raw_floor, problems)
        if value is not None and value < 0:
            problems.append((_key(MIN_THROUGHPUT), f"must be >= 0, got {raw_floor!r}"))
        elif value is not None:
            floor = value

    # read by the node agent, checked here so a bad value is refused at admission
    for name, parse in ((PROGRESS_METRICS, parse_progress_metrics), (WARMUP, parse_warmup_seconds)):
        raw_agent = get(name)
        if raw_agent is not None:
            try:
                parse(raw_agent)
            except ValueError as exc:
                problems.append((_key(name), str(exc)))

    migration_allowed = False
    raw_migration = get(MIGRATION)
    if raw_migration is not None:
        if raw_migration.lower() not in ("allowed", "never"):
            problems.append((_key(MIGRATION), f"must be allowed or never, got {raw_migration!r}"))
        migration_allowed = raw_migration.lower() == "allowed"

    family: ProfileFamily | None = None
    raw_family = get(FAMILY)
    if not raw_family:
        problems.append((_key(FAMILY), "is required for a pod that uses elastico.io/ annotations"))
    else:
        try:
            family = resolve(raw_family)
        except UnknownWorkloadError as exc:
            if unprofiled is None or kind is None:
                hint = f"; or set {_key(KIND)} to run it unprofiled" if unprofiled else ""
                problems.append((_key(FAMILY), f"{exc}{hint}"))
            else:
                try:
                    family = unprofiled(raw_family, kind)
                except UnknownWorkloadError as why:
                    problems.append((_key(FAMILY), str(why)))

    allowed: tuple[int, ...] | None = None
    if family is not None:
        if kind is not None and kind is not family.kind:
            problems.append(
                (
                    _key(KIND),
                    f"{kind.value} does not match family {family.workload!r} ({family.kind.value})",
                )
            )
        space = family_knob_space(family)
        raw_allowed = get(ALLOWED)
        raw_config = get(CONFIGURATION)
        if raw_allowed:
            ranges = _parse_allowed(raw_allowed, space, problems)
            if ranges:
                rows = space.allowed_rows(family.configs, ranges)
                if not rows:
                    problems.append((_key(ALLOWED), "no configuration of the family satisfies it"))
                allowed = rows
        if raw_config is not None:
            if mode is not Mode.FIXED:
                problems.append((_key(CONFIGURATION), "is only valid with elastico.io/mode: fixed"))
            else:
                row = _parse_configuration(raw_config, family, space, problems)
                if row is not None:
                    if allowed is not None and row not in allowed:
                        problems.append(
                            (_key(CONFIGURATION), "is outside the elastico.io/allowed ranges")
                        )
                    allowed = (row,)
        elif mode is Mode.FIXED:
            allowed = (family.fastest_index,) if allowed is None else allowed[:1]
        if floor > 0:
            rows = tuple(allowed) if allowed is not None else tuple(range(family.size))
            best = max((float(family.throughput[r]) for r in rows), default=0.0)
            if rows and best < floor:
                problems.append(
                    (
                        _key(MIN_THROUGHPUT),
                        f"{floor:g} {family.throughput_unit} exceeds the best allowed "
                        f"configuration's {best:.4g} {family.throughput_unit}",
                    )
                )
    if problems:
        raise AnnotationError(problems)
    assert family is not None
    return PodIntent(
        family=family,
        mode=mode,
        kind=family.kind,
        min_throughput=floor,
        weight=weight,
        allowed=allowed,
        migration_allowed=migration_allowed,
    )


def decision_annotations(
    *,
    node: str,
    devices: tuple[int, ...],
    kind: JobKind,
    configuration: Configuration,
    memory_budget_mib: float,
    device_memory_mib: float,
    sm_share: float,
    mps: bool,
    predicted_slowdown: float,
    price_epoch: int,
    configmap: str,
) -> dict[str, str]:
    """The annotations bind (and every in-place reconfiguration) writes on the pod.

    All strings; ``elastico-run`` reads them back through the downward-API file.
    The budget is rounded by :func:`core.handoff.memory_share`, as in the ConfigMap.
    """
    share = memory_share(memory_budget_mib, device_memory_mib)
    return {
        _key(WORKLOAD_KIND): kind.value,
        _key(ASSIGNED_KNOBS): json.dumps(configuration.as_dict()),  # knob order = the label's
        _key(DEVICE_MEMORY): str(share.device_mib),
        _key(SM_SHARE): f"{sm_share:.4f}",
        _key(MPS): "true" if mps else "false",
        _key(ASSIGNED_NODE): node,
        _key(ASSIGNED_DEVICES): ",".join(str(d) for d in devices),
        _key(ASSIGNED_CONFIGURATION): configuration.label,
        _key(MEMORY_BUDGET): str(share.budget_mib),
        _key(PREDICTED_SLOWDOWN): f"{predicted_slowdown:.3f}",
        _key(PRICE_EPOCH): str(price_epoch),
        _key(CONFIGMAP): configmap,
    }


def configmap_name(meta: Mapping[str, Any]) -> str:
    """The ConfigMap bind writes a pod's decision to: the one the webhook named
    (``elastico.io/configmap``), else ``elastico-<pod name>`` (a pod the webhook did not
    see), cut to a DNS subdomain's 253 characters."""
    named = (meta.get("annotations") or {}).get(_key(CONFIGMAP))
    if isinstance(named, str) and named:
        return named
    return ("elastico-" + str(meta.get("name", "")))[:253]


def device_indices(text: str) -> tuple[int, ...] | None:
    """GPU indices as bind writes them (``"0,3"``: distinct, not negative); None when
    ``text`` is not that (a GPU held twice, a word)."""
    try:
        indices = tuple(int(d) for d in text.split(",") if d.strip())
    except ValueError:
        return None
    if len(set(indices)) != len(indices) or any(i < 0 for i in indices):
        return None
    return indices


def read_decision(annotations: Mapping[str, str] | None) -> Decision | None:
    """The decision bind recorded, or None when absent or unreadable."""
    if not annotations:
        return None
    node = annotations.get(_key(ASSIGNED_NODE))
    devices = annotations.get(_key(ASSIGNED_DEVICES))
    if not node or devices is None:
        return None
    indices = device_indices(devices)
    if indices is None:
        return None  # not what bind writes (distinct GPU indices): a GPU held twice
    try:
        budget = float(annotations.get(_key(MEMORY_BUDGET), "0") or 0)
    except ValueError:
        return None
    return Decision(
        node=node,
        devices=indices,
        configuration=annotations.get(_key(ASSIGNED_CONFIGURATION), ""),
        memory_budget_mib=budget,
    )
