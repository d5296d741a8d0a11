"""Read-only REST views of what is published: prices, jobs, nodes, the plan; and the
paging of every view that is served in pages, /observations included.

They read the published plan and view and the bookings; they own nothing but the
serialised replies they keep (:meth:`RestViews.kept`).

The views are built on the event loop that also answers kube-scheduler's verbs, so a
large one holds every scheduling request up while it builds (about 0.2 s for /nodes at
5,000 nodes).  /jobs, /nodes and /plan change only when a plan is published or a
booking is made or dropped, so their bytes are kept and served again until then.

/jobs and /nodes are lists that grow with the cluster (about 5 MB at 5,000 nodes), so
they are also served in pages, as the API server serves lists: ``?limit=N`` and then
``?continue=TOKEN``.  Each page is cut from one kept :class:`Listing` (the rows of one
state of the view), so the pages of one walk make up one consistent list even when a
plan is published in between.  The current listing and the newest older ones that tokens
name are kept (:data:`SNAPSHOTS_KEPT` per view); a token of one no longer kept is a 410
Gone, as the API server's expired continue token is.

GET /observations (``service/observations.py``) is an object, not a list: its lists of a
row per pod or pair are paged as one run of rows (a :class:`Sections` build), each page
carrying every such list with its rows in that page, and its summary members come on the
first page.  It changes with the clock (``now``, every age), so each first page builds it
afresh (:meth:`RestViews._inputs` is None) and the later pages read that build.  It is
built in a worker thread, not on the event loop: the listings' bookkeeping is under one
lock (:attr:`RestViews._lock`), held only to look a listing up or register one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import itertools
import math
import secrets
import threading
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from elastico_extender.cluster.objects import pod_key
from elastico_extender.core.model import DeviceRef
from elastico_extender.core.resources import GPU_SM, RESOURCE_NAMES
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.errors import RequestRefused
from elastico_extender.service.bookings import Bookings, Published

__all__ = [
    "BUILT_AT_EACH_READ",
    "MAX_CONTINUE_CHARS",
    "MAX_LIMIT",
    "PAGED_VIEWS",
    "SNAPSHOTS_KEPT",
    "PageRefused",
    "RestViews",
    "Sections",
    "to_json",
]

PAGED_VIEWS = ("jobs", "nodes")
"""The views that are lists of rows, served in pages when asked (``limit``/``continue``);
their whole reply is their current listing's."""
BUILT_AT_EACH_READ = ("observations",)
"""Paged views that change with the clock: each first page builds a listing of its own."""
MAX_LIMIT = 1000
"""Largest ``limit``: about 0.5 MB of /jobs, 0.6 MB of /nodes or 0.35 MB of
/observations' rows per page (kubectl's own lists use 500)."""
SNAPSHOTS_KEPT = 3
"""Listings kept per paged view, the current one included (each the size of the whole
view): a walk survives two newer paged listings started by other readers after the view
changed.  A listing no token names is dropped once it is not current, so readers of the
whole list alone keep one, as before paging."""
MAX_CONTINUE_CHARS = 100
"""Longest continue token read (the tokens given out are about 40 characters)."""


class PageRefused(RequestRefused):
    """A page that cannot be served: 400 (a bad token) or 410 (its listing is gone);
    ``message`` names the parameter."""


class Sections(NamedTuple):
    """What a paged view that is an object builds: ``lists``, its members that are lists
    of rows, paged as one run of rows in this order (a page carries every one of them,
    with those of its rows that fall in the page); ``head``, its other members, on the
    first page only."""

    lists: dict[str, list[Any]]
    head: dict[str, Any]


@dataclass(eq=False)
class Listing:
    """One state of a paged view: ``whole``, the JSON list of its rows (for /jobs and
    /nodes, the unpaged reply), and ``bounds``, where each row starts in it (row ``i`` is
    ``whole[bounds[i]:bounds[i + 1] - 1]``; the last bound is ``len(whole)``), so a page
    is one slice and the rows are not kept twice.  ``inputs``: what it was built from
    (:meth:`RestViews._inputs`; None when they changed while it was built, or when the
    view is built at each read, so it is never served as current again); ``paged``: a
    continue token names it.  ``sections``: the member each run of rows is listed under
    in a page, with its first row; ``head``: the members of the first page but those
    (JSON object members, without the braces)."""

    serial: int
    inputs: tuple[Any, ...] | None
    whole: bytes
    bounds: array[int]
    paged: bool = False
    sections: tuple[tuple[str, int], ...] = (("items", 0),)
    head: bytes = b""

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def spans(self) -> list[tuple[str, int, int]]:
        """Each section's member name, first row and end (excluded)."""
        ends = [first for _, first in self.sections[1:]] + [len(self)]
        return [(name, first, end) for (name, first), end in zip(self.sections, ends, strict=True)]

    def items(self, start: int, end: int) -> bytes:
        """Rows ``start`` to ``end`` (excluded), comma-separated, as in ``whole``."""
        return self.whole[self.bounds[start] : self.bounds[end] - 1] if start < end else b""


def to_json(content: Any) -> bytes:
    """A reply's JSON (numpy numbers and arrays as JSON numbers and lists)."""
    return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


class RestViews:
    """GET /prices, /jobs, /nodes, /plan (see :mod:`elastico_extender.api.routes.rest`).

    ``pod``: the cluster view's pod by UID, to name the invalid pods in /jobs."""

    def __init__(
        self,
        bookings: Bookings,
        history: Sequence[dict[str, Any]],
        predictor_name: str,
        predictor_degraded: str | None,
        planner_settings: PlannerSettings | None = None,
        pod: Callable[[str], Mapping[str, Any] | None] = lambda uid: None,
    ) -> None:
        self.bookings = bookings
        self.history = history
        self.predictor_name = predictor_name
        self.predictor_degraded = predictor_degraded
        self.planner_changed = (planner_settings or PlannerSettings()).changed()
        """The planner settings that differ from the defaults, shown on GET /plan."""
        self.pod = pod
        self._replies: dict[str, tuple[tuple[Any, ...], bytes]] = {}
        """One kept reply per unpaged view name (/plan)."""
        self._listings: dict[str, list[Listing]] = {}
        """Per paged view, the current listing and the newest older ones that continue
        tokens name: :data:`SNAPSHOTS_KEPT` at most, oldest first."""
        self._serial = 0
        """The serial of the last listing built (the tokens name listings by it)."""
        self._replica = secrets.token_hex(4)
        """This process's mark in its tokens: another replica behind the same Service (or
        this one before a restart) numbers its own listings, so its tokens are refused."""
        self._key = secrets.token_bytes(16)
        """Seals this process's tokens (:meth:`_sealed`): a token is opaque to its reader, and
        one it did not give is refused as such, not taken for a listing of another view
        or one no longer kept."""
        self._lock = threading.Lock()
        """Held to read or change :attr:`_listings` and :attr:`_serial` (never to build):
        /observations is paged from worker threads, /jobs and /nodes on the event loop."""

    def _sealed(self, replica: str, view: str, serial: int, row: int) -> str:
        """A continue token's text (before base64; :func:`_token_fields` reads it back):
        its fields and a short keyed digest of them (16 hex digits)."""
        text = f"{replica}:{view}:{serial}:{row}"
        return text + ":" + hmac.new(self._key, text.encode(), hashlib.blake2b).hexdigest()[:16]

    def kept(self, name: str, build: Callable[[], Any]) -> bytes:
        """View ``name`` as JSON: the kept reply while what the view reads is unchanged,
        else ``build()``'s, kept if nothing changed while it was built (for a paged view,
        that of its current :class:`Listing`).

        What such a view reads that can change: the published plan and the bookings
        (:attr:`Bookings.version` moves at every publish, booking and release; the
        epoch drops confirmed and expired bookings without moving it, so the bookings
        themselves count too) and, for /jobs, the invalid pods' names (the cluster
        view).  A published plan is never changed after the publish."""
        if name in PAGED_VIEWS:
            return self._current(name, build).whole
        key = self._inputs(name)
        kept = self._replies.get(name)
        if kept is not None and kept[0] == key:
            return kept[1]
        reply = to_json(build())
        # else built on newer inputs than ``key`` says, or never the same twice
        if key is not None and self._inputs(name) == key:
            self._replies[name] = (key, reply)
        return reply

    def page(
        self,
        name: str,
        build: Callable[[], list[Any] | Sections],
        limit: int | None,
        token: str | None,
    ) -> bytes:
        """One page of paged view ``name``, as a Kubernetes list:
        ``{"metadata": {"continue", "remainingItemCount"}, "items": [...]}``, both
        metadata fields only while rows remain (for a :class:`Sections` view, its lists
        in place of ``items``, and its head on the first page).  Without ``token``, the
        first ``limit`` rows of the current listing; with it, the next ``limit`` of the
        token's listing (all the rest when ``limit`` is None).  :class:`PageRefused` for
        a bad token."""
        if token is None:
            listing, start = self._current(name, build, limit), 0
        else:
            listing, start = self._resume(name, token)
        rows = len(listing)
        end = rows if limit is None else min(rows, start + limit)
        meta: dict[str, Any] = {}
        if end < rows:
            text = self._sealed(self._replica, name, listing.serial, end)
            meta["continue"] = base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")
            meta["remainingItemCount"] = rows - end
        members = [b'"metadata":' + to_json(meta)]
        if start == 0 and listing.head:
            members.append(listing.head)
        for section, first, last in listing.spans():
            rows_here = listing.items(max(start, first), min(end, last))
            members.append(b"%b:[%b]" % (to_json(section), rows_here))
        return b"{%b}" % b",".join(members)

    def _current(
        self, name: str, build: Callable[[], list[Any] | Sections], limit: int | None = None
    ) -> Listing:
        """The listing of view ``name`` as it is now: the newest kept while what the view
        reads is unchanged, else one built now; marked paged when its first ``limit``
        rows leave some.  Of the older ones, those a continue token names are kept (the
        newest :data:`SNAPSHOTS_KEPT` in all), the rest dropped."""
        key = self._inputs(name)
        with self._lock:
            kept = self._listings.get(name)
            if key is not None and kept and kept[-1].inputs == key:
                kept[-1].paged |= limit is not None and limit < len(kept[-1])
                return kept[-1]
        built = build()
        parts = built if isinstance(built, Sections) else Sections({"items": built}, {})
        whole, bounds = _joined([row for rows in parts.lists.values() for row in rows])
        sections, first = [], 0
        for section, rows in parts.lists.items():
            sections.append((section, first))
            first += len(rows)
        head = to_json(parts.head)[1:-1]  # the members, without the object's braces
        # built on newer inputs than ``key`` says: a list all the same, never current
        inputs = key if key is not None and self._inputs(name) == key else None
        paged = limit is not None and limit < len(bounds) - 1
        with self._lock:
            self._serial += 1
            listing = Listing(self._serial, inputs, whole, bounds, paged, tuple(sections), head)
            older = [x for x in self._listings.get(name, ()) if x.paged]
            self._listings[name] = [*older[max(0, len(older) + 1 - SNAPSHOTS_KEPT) :], listing]
        return listing

    def _resume(self, name: str, token: str) -> tuple[Listing, int]:
        """The listing and row a continue ``token`` of view ``name`` names."""
        if len(token) > MAX_CONTINUE_CHARS:
            raise PageRefused(400, f"continue: longer than {MAX_CONTINUE_CHARS} characters")
        fields = _token_fields(token)
        forged = PageRefused(
            400, "continue: not a token this server gave; pass metadata.continue unchanged"
        )
        if fields is None:
            raise forged
        replica, view, serial, start, seal = fields
        if view != name:
            raise PageRefused(400, f"continue: the token continues /{view[:20]}, not /{name}")
        if replica != self._replica:  # its seal is another process's: it cannot be checked
            raise PageRefused(
                410,
                "continue: the token was given by another extender replica, or by this one "
                "before it restarted; start the list again without continue",
            )
        expected = self._sealed(replica, view, serial, start).rpartition(":")[2]
        if not hmac.compare_digest(seal, expected):
            raise forged
        with self._lock:
            if serial > self._serial:
                raise PageRefused(400, "continue: not a token this server gave")
            kept = list(self._listings.get(name, ()))
        listing = next((x for x in kept if x.serial == serial), None)
        if listing is None:
            raise PageRefused(
                410,
                f"continue: the list it continues is no longer kept (/{name} changed and "
                f"{SNAPSHOTS_KEPT - 1} newer lists were paged since); start the list again "
                "without continue",
            )
        if not 0 < start < len(listing):
            raise PageRefused(400, "continue: not a token this server gave (no such row)")
        return listing, start

    def _inputs(self, name: str) -> tuple[Any, ...] | None:
        """What view ``name`` reads that can change (:meth:`kept`); None for a view built
        at each read (/observations: it carries ``now`` and every age)."""
        if name in BUILT_AT_EACH_READ:
            return None
        pub, booked, version = self.bookings.current()
        names = self._invalid_names(pub) if name == "jobs" else ()
        return (version, tuple(booked.values()), names)

    def _invalid_names(self, pub: Published) -> tuple[str | None, ...]:
        """``namespace/name`` of each invalid pod (they never became jobs), in
        ``pub.invalid``'s order; None for one gone from the cluster view."""
        objs = [self.pod(uid) for uid in pub.invalid]
        return tuple(None if obj is None else pod_key(obj) for obj in objs)

    def prices(self) -> dict[str, Any]:
        pub = self.bookings.published
        return {
            "epoch": pub.plan.epoch,
            "resources": pub.plan.price_map(),
            "units": dict(zip(RESOURCE_NAMES, ("fraction", "MiB", "cores", "MiB"), strict=True)),
            "history": list(self.history),
        }

    def jobs(self) -> list[dict[str, Any]]:
        pub, booked, _ = self.bookings.current()
        rows = []
        for job in pub.snapshot.jobs:
            pj = pub.pods.get(job.id)
            if pj is None:
                continue
            a = pub.plan.assignments.get(job.id)
            state = "running" if job.running else "pending"
            if job.id in pub.plan.rejected:
                state = "rejected"
            elif job.id in pub.plan.queued:
                state = "queued"
            elif job.id in booked:
                state = "binding"
            row: dict[str, Any] = {
                "id": job.id,
                "pod": pj.key,
                "family": job.family,
                "kind": job.kind.value,
                "mode": job.mode.value,
                "gpus": job.gpus,
                "weight": job.weight,
                "floor": job.min_throughput,
                "throughput_unit": pj.family.throughput_unit,
                "state": state,
                "reason": _reason(
                    pub.plan.rejected.get(job.id) or pub.plan.queue_reasons.get(job.id), pj.note
                ),
                # learned from finished pods (service.completions); None: not enough yet
                "expected_duration_s": job.expected_duration_s or None,
                # whether the plan may stop, requeue or move it (service.pods.unmovable)
                "preemptible": job.preemptible,
            }
            if a is not None:
                row.update(
                    {
                        "action": a.action.value,
                        "configuration": a.configuration.label,
                        "config_index": a.config_index,
                        "devices": [f"{n}/{d}" for n, d in a.devices],
                        "memory_budget_mib": a.memory_budget_mib,
                        "throughput": a.throughput,
                        "predicted_slowdown": a.predicted_slowdown,
                        "tolerance": a.tolerance if math.isfinite(a.tolerance) else None,
                        "estimated_profile": a.estimated,
                    }
                )
            rows.append(row)
        invalid_names = self._invalid_names(pub)
        for (uid, message), name in zip(pub.invalid.items(), invalid_names, strict=True):
            rows.append({"id": uid, "state": "invalid", "reason": message, "pod": name})
        return rows

    def nodes(self) -> list[dict[str, Any]]:
        pub, booked, _ = self.bookings.current()
        occupants: dict[DeviceRef, list[tuple[str, float, float]]] = {}
        for a in pub.plan.assignments.values():
            if a.job_id in booked:
                continue  # shown where it was booked, below
            pj = pub.pods.get(a.job_id)
            sm = float(pj.family.resources[a.config_index, GPU_SM]) if pj else 0.0
            for ref in a.devices:
                occupants.setdefault(ref, []).append(
                    (pj.key if pj else a.job_id, a.memory_budget_mib, sm)
                )
        for x in booked.values():
            sm = float(x.pod_job.family.resources[x.verdict.config_index, GPU_SM])
            for ref in x.verdict.devices:
                occupants.setdefault(ref, []).append(
                    (x.pod_job.key, x.verdict.memory_budget_mib, sm)
                )
        rows = []
        for node in pub.snapshot.nodes:
            gpus = []
            pairs: list[list[str]] = []
            seen: set[frozenset[str]] = set()
            for g in node.gpus:
                here = occupants.get((node.name, g.index))  # None: nothing on it
                names = [p for p, _, _ in here] if here else []
                sm_assigned = float(sum(s for _, _, s in here)) if here else 0.0
                gpus.append(
                    {
                        "index": g.index,
                        "product": g.product,
                        "memory_mib": g.memory_mib,
                        "memory_assigned_mib": float(sum(m for _, m, _ in here)) if here else 0.0,
                        "sm_assigned": 0.0 if sm_assigned < 0.0 else sm_assigned,
                        "pods": names,
                    }
                )
                for first, second in itertools.combinations(names, 2):
                    pair = frozenset((first, second))
                    if pair not in seen:  # pods that share several GPUs: one pair
                        seen.add(pair)
                        pairs.append([first, second])
            rows.append(
                {
                    "name": node.name,
                    "cpu_cores": node.cpu_cores,
                    "host_mem_mib": node.host_mem_mib,
                    "gpus": gpus,
                    "colocated_pairs": pairs,
                }
            )
        return rows

    def plan_summary(self) -> dict[str, Any]:
        pub = self.bookings.published
        p = pub.plan
        return {
            "epoch": p.epoch,
            "published_at": pub.published_at,
            "epoch_ms": pub.epoch_ms,
            "prices": p.price_map(),
            "utilization": p.utilization,
            "assignments": {
                job_id: {
                    "pod": pub.pods[job_id].key if job_id in pub.pods else job_id,
                    "configuration": a.configuration.label,
                    "devices": [f"{n}/{d}" for n, d in a.devices],
                    "action": a.action.value,
                    "memory_budget_mib": a.memory_budget_mib,
                    "predicted_slowdown": a.predicted_slowdown,
                }
                for job_id, a in p.assignments.items()
            },
            "queued": list(p.queued),
            "rejected": dict(p.rejected),
            "queue_reasons": dict(p.queue_reasons),
            "preempted": list(p.preempted),
            "violations": [list(v) for v in p.violations],
            "stats": {k: float(v) for k, v in p.stats.items()},
            "predictor": self.predictor_name,
            "predictor_degraded": self.predictor_degraded,
            "planner_settings": dict(self.planner_changed),
        }


def _joined(rows: list[Any]) -> tuple[bytes, array[int]]:
    """``to_json(rows)``, and where each row starts in it (:class:`Listing`).  Each row is
    appended as soon as it is serialised: a bytes object kept per row made the build of
    /jobs at 10,000 pods several times slower (fresh memory for each)."""
    whole = bytearray(b"[")
    bounds = array("q", [1])
    for row in rows:
        whole += to_json(row)
        whole += b","
        bounds.append(len(whole))
    if rows:
        whole[-1:] = b"]"  # in place of the last comma
    else:
        whole += b"]"
    return bytes(whole), bounds


def _token_fields(token: str) -> tuple[str, str, int, int, str] | None:
    """A continue token's (replica, view, listing serial, row, seal); None when it is not
    one this module could have given (checked for length before anything is decoded)."""
    if len(token) > MAX_CONTINUE_CHARS or not token.isascii():
        return None
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("ascii")
    except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    parts = text.split(":")
    if len(parts) != 5 or not all(p.isdigit() and len(p) <= 18 for p in parts[2:4]):
        return None
    return parts[0], parts[1], int(parts[2]), int(parts[3]), parts[4]


def _reason(why: str | None, note: str) -> str | None:
    """A job's reason in /jobs: why the plan rejected or queued it, with what is peculiar
    to its pod (e.g. created without the webhook) as filter words it."""
    if why and note:
        return f"{why} (pod {note})"
    return why or note or None
