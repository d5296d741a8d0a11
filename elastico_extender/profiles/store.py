"""The profile store: measured (R, T, features) per (workload, hardware, configuration).

An embedded SQLite file by default (``:memory:`` for throw-away use).  The
store is the only place measured profiles live; :meth:`ProfileStore.family`
merges them over a base family (the built-in catalog, or a user's own) and
fills every unmeasured configuration by nearest neighbour (flagged estimated).
Measured rows always take precedence.  Rows are keyed by hardware signature,
so a node with different GPUs never reuses another GPU's numbers, and
:meth:`invalidate` drops what a hardware or framework change made stale.
The newest ``capacity`` rows (by ``measured_at``) are kept: every unprofiled
family ever seen adds one, and family names churn forever.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

import numpy as np

from elastico_extender.core.interference.features import NUM_JOB_FEATURES
from elastico_extender.core.model import Configuration, ProfileFamily
from elastico_extender.core.resources import NUM_RESOURCES
from elastico_extender.core.shapes.estimate import nearest_measured
from elastico_extender.errors import InvalidProfileError, ProfileStoreError

__all__ = [
    "MAX_PROFILES",
    "ProfileRecord",
    "ProfileStore",
    "finite_cell",
    "is_number",
    "keep_newest",
    "keep_newest_at_open",
    "kept_rows",
    "newest_first",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_PROFILES = 100_000
"""Rows a profile store keeps, the newest measured: a catalog family profiled on one GPU
type takes at most a few hundred, an unprofiled family's solo window one."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS profiles (
    workload      TEXT NOT NULL,
    hardware      TEXT NOT NULL,
    configuration TEXT NOT NULL,   -- canonical JSON of the knob values
    resources     TEXT NOT NULL,   -- JSON list, units of core.resources
    throughput    REAL NOT NULL,
    features      TEXT,            -- JSON list of the 14 per-job IAC features, or NULL
    measured_at   REAL NOT NULL,   -- seconds since the epoch, supplied by the caller
    PRIMARY KEY (workload, hardware, configuration)
);
"""


def open_database(
    path: str,
    schema: str,
    what: str,
    migrate: Callable[[sqlite3.Connection], None] | None = None,
) -> sqlite3.Connection:
    """An SQLite connection shared by threads (callers hold their own lock) with ``schema``
    applied (after ``migrate`` brought an earlier layout up to it); any failure is a
    :class:`ProfileStoreError` naming ``what`` and the file.

    A file SQLite finds damaged, or whose tables of ``schema``'s names have other columns
    (another program's, or a newer layout), is refused here, untouched, rather than
    failing at its first read or write with what was learned since lost."""
    db: sqlite3.Connection | None = None
    try:
        db = sqlite3.connect(path, check_same_thread=False)
        damage = [" ".join(str(row[0]).split()) for row in db.execute("PRAGMA quick_check(3)")]
        if damage != ["ok"]:  # said on one line
            raise sqlite3.DatabaseError("database disk image is malformed: " + "; ".join(damage))
        db.executescript(schema)
        if migrate is not None:
            migrate(db)
        _check_layout(db, schema)
    except sqlite3.Error as exc:
        if db is not None:
            db.close()
        raise ProfileStoreError(f"cannot open {what} {path}: {exc}") from exc
    return db


def is_number(column: str) -> str:
    """SQL that is true where ``column`` holds a number: SQLite keeps text written where a
    number belongs as text, and sorts it above every number."""
    return f"typeof({column}) IN ('integer', 'real')"


def newest_first(column: str) -> str:
    """An ``ORDER BY`` for ``column`` (a time), newest first, rows whose time is no number
    last: SQLite sorts text above every number, so a few rows an older or hostile writer
    left with 'later' there would otherwise be the "newest" kept and read, and the
    learned rows the ones pruned or cut by a ``LIMIT``."""
    return f"{is_number(column)} DESC, {column} DESC"


def keep_newest(db: sqlite3.Connection, table: str, newest: str, capacity: int) -> int:
    """Delete the rows of ``table`` beyond the ``capacity`` with the largest ``newest``
    column (the caller commits); how many.  Within the bound it writes nothing, so a
    store opens without a write lock: a read-only file, or one another process (the old
    leader in a rollout) is writing, is read as it is."""
    (rows,) = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
    if rows <= capacity:
        return 0
    return db.execute(
        f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} "
        f"ORDER BY {newest_first(newest)}, rowid DESC LIMIT -1 OFFSET ?)",
        (capacity,),
    ).rowcount


def keep_newest_at_open(
    db: sqlite3.Connection, table: str, newest: str, capacity: int, event: str, path: str
) -> None:
    """:func:`keep_newest` when a store opens, committed: a store restarted more often than
    it prunes while writing still shrinks.  A file it cannot write (read-only) is read as
    it is; the failure is logged as ``event``."""
    try:
        with db:
            keep_newest(db, table, newest, capacity)
    except sqlite3.Error as exc:
        log.warning(event, extra={"path": path, "error": str(exc)})


def _check_layout(db: sqlite3.Connection, schema: str) -> None:
    """Raise if a table ``schema`` creates has other columns in ``db`` than in ``schema``."""
    expected = sqlite3.connect(":memory:")
    try:
        expected.executescript(schema)
        tables = [
            row[0]
            for row in expected.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        for table in tables:
            want = [row[1] for row in expected.execute(f"PRAGMA table_info({table})")]
            have = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
            if have != want:
                raise sqlite3.DatabaseError(
                    f"table {table} has columns {have}, this version needs {want} (a file of "
                    "another program or of another ElastiCo version: move it aside or name "
                    "another file)"
                )
    finally:
        expected.close()


def _config_key(configuration: Configuration) -> str:
    return json.dumps(configuration.as_dict(), sort_keys=True)


@dataclass(frozen=True)
class ProfileRecord:
    workload: str
    hardware: str
    configuration: Configuration
    resources: np.ndarray
    throughput: float
    features: np.ndarray | None
    measured_at: float


def finite_cell(value: object) -> TypeGuard[float]:
    """Whether a stored value is a finite number (SQLite keeps text written where a number
    belongs, 'NaN' included, as text)."""
    return isinstance(value, int | float) and math.isfinite(value)


def kept_rows(
    rows: list[T], usable: Callable[[T], bool], logger: logging.Logger, event: str, **context: Any
) -> list[T]:
    """The rows ``usable`` accepts; the others (an older or hostile writer's: text where
    numbers belong, another layout) are skipped with one ``event`` warning on ``logger``
    giving ``context`` (the file, the table) and how many: one foreign row must not cost
    every row, nor stop the service from starting."""
    kept = [row for row in rows if usable(row)]
    if len(kept) < len(rows):
        logger.warning(event, extra={**context, "skipped": len(rows) - len(kept)})
    return kept


def _record(workload: str, hardware: str, row: tuple[Any, ...]) -> ProfileRecord | None:
    """One stored row as a record, or None when it is not a row :meth:`ProfileStore.put`
    writes (an older or hostile writer's: a configuration that is not a JSON object of
    knob values, resources or features of another length or not finite, a throughput
    that is not a positive number): one such row must not cost the family its reads."""
    cfg, res, tput, feats, at = row
    try:
        knobs = json.loads(cfg)
        resources = np.array(json.loads(res), dtype=np.float64)
        features = None if feats is None else np.array(json.loads(feats), dtype=np.float64)
    except (TypeError, ValueError, RecursionError):  # RecursionError: nesting too deep
        return None
    if not isinstance(knobs, dict) or not all(
        isinstance(v, int | float | str) for v in knobs.values()
    ):
        return None
    if resources.shape != (NUM_RESOURCES,) or not np.isfinite(resources).all():
        return None
    if (resources < 0).any() or not (finite_cell(tput) and tput > 0) or not finite_cell(at):
        return None
    if features is not None and (
        features.shape != (NUM_JOB_FEATURES,) or not np.isfinite(features).all()
    ):
        return None
    return ProfileRecord(
        workload=workload,
        hardware=hardware,
        configuration=Configuration.from_dict(knobs),
        resources=resources,
        throughput=float(tput),
        features=features,
        measured_at=float(at),
    )


class ProfileStore:
    """Thread-safe SQLite store of measured profiles."""

    def __init__(self, path: str | Path = ":memory:", capacity: int = MAX_PROFILES) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.path = str(path)
        self.capacity = capacity
        self._db = open_database(self.path, _SCHEMA, "profile store")
        self._lock = threading.Lock()
        self._since_prune = 0
        keep_newest_at_open(
            self._db, "profiles", "measured_at", capacity, "profiles.not_pruned", self.path
        )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def put(
        self,
        workload: str,
        hardware: str,
        configuration: Configuration,
        resources: np.ndarray,
        throughput: float,
        features: np.ndarray | None = None,
        measured_at: float = 0.0,
    ) -> None:
        """Insert or replace one measured profile; rejects NaN / negative numbers."""
        r = np.asarray(resources, dtype=np.float64)
        if r.shape != (NUM_RESOURCES,) or not np.isfinite(r).all() or (r < 0).any():
            raise InvalidProfileError(
                f"{workload} {configuration.label}: resources must be {NUM_RESOURCES} "
                f"finite non-negative numbers, got {r.tolist()}"
            )
        if not (math.isfinite(throughput) and throughput > 0):
            raise InvalidProfileError(
                f"{workload} {configuration.label}: throughput must be > 0, got {throughput}"
            )
        feats = None
        if features is not None:
            f = np.asarray(features, dtype=np.float64)
            if f.shape != (NUM_JOB_FEATURES,) or not np.isfinite(f).all():
                raise InvalidProfileError(
                    f"{workload} {configuration.label}: features must be "
                    f"{NUM_JOB_FEATURES} finite numbers"
                )
            feats = json.dumps(f.tolist())
        row = (
            workload,
            hardware,
            _config_key(configuration),
            json.dumps(r.tolist()),
            float(throughput),
            feats,
            float(measured_at),
        )
        with self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO profiles VALUES (?,?,?,?,?,?,?)", row)
            # pruned after each tenth of the bound written: at most that much more kept
            self._since_prune += 1
            if self._since_prune >= max(1, self.capacity // 10):
                self._prune()

    def _prune(self) -> None:
        """Drop the rows beyond ``capacity``, the oldest measured first (caller commits)."""
        self._since_prune = 0
        keep_newest(self._db, "profiles", "measured_at", self.capacity)

    def records(self, workload: str, hardware: str) -> list[ProfileRecord]:
        """``workload``'s measured rows on ``hardware``; a failed read (a damaged file, a
        failing disk) is a :class:`ProfileStoreError` naming the file."""
        try:
            with self._lock:
                rows = self._db.execute(
                    "SELECT configuration, resources, throughput, features, measured_at "
                    "FROM profiles WHERE workload=? AND hardware=? ORDER BY configuration",
                    (workload, hardware),
                ).fetchall()
        except sqlite3.Error as exc:
            raise ProfileStoreError(f"cannot read profile store {self.path}: {exc}") from exc
        records = [_record(workload, hardware, row) for row in rows]
        kept = kept_rows(
            records,
            lambda r: r is not None,
            log,
            "profiles.foreign_rows",
            path=self.path,
            workload=workload,
        )
        return [r for r in kept if r is not None]  # the same list, as the type checker sees it

    def invalidate(self, *, hardware: str | None = None, workload: str | None = None) -> int:
        """Delete stale rows (by hardware signature and/or workload); returns how many."""
        clauses, args = [], []
        if hardware is not None:
            clauses.append("hardware=?")
            args.append(hardware)
        if workload is not None:
            clauses.append("workload=?")
            args.append(workload)
        where = " WHERE " + " AND ".join(clauses) if clauses else ""
        with self._lock, self._db:
            return self._db.execute(f"DELETE FROM profiles{where}", args).rowcount

    def keep_only_hardware(self, current: set[str]) -> int:
        """Drop every row whose hardware signature is no longer in the cluster."""
        with self._lock, self._db:
            marks = ",".join("?" * len(current)) or "''"
            return self._db.execute(
                f"DELETE FROM profiles WHERE hardware NOT IN ({marks})", sorted(current)
            ).rowcount

    def family(self, base: ProfileFamily, hardware: str | None = None) -> ProfileFamily:
        """``base`` with measured rows substituted and the rest estimated from them.

        With no measured rows the base family is returned unchanged (its rows
        keep their own ``estimated`` flags).  Measured configurations that the
        base family does not list are ignored (the knob space defines the family).
        """
        signature = hardware or base.hardware
        records = self.records(base.workload, signature)
        if not records:
            return base
        index = {_config_key(c): i for i, c in enumerate(base.configs)}
        rows = [
            (index[_config_key(r.configuration)], r)
            for r in records
            if _config_key(r.configuration) in index
        ]
        if not rows:
            return base
        resources = np.array(base.resources)
        throughput = np.array(base.throughput)
        features = np.array(base.features)
        measured_mask = np.zeros(base.size, dtype=bool)
        for i, rec in rows:
            resources[i] = rec.resources
            throughput[i] = rec.throughput
            if rec.features is not None:
                features[i] = rec.features
            measured_mask[i] = True
        measured_rows = np.flatnonzero(measured_mask)
        missing = np.flatnonzero(~measured_mask)
        if missing.size:
            nearest = measured_rows[nearest_measured(resources[missing], resources[measured_rows])]
            # Scale the neighbour's throughput by the base model's ratio between the two rows,
            # so the estimate keeps the catalog's shape but the measurement's level.
            ratio = base.throughput[missing] / base.throughput[nearest]
            throughput[missing] = throughput[nearest] * ratio
        return ProfileFamily(
            workload=base.workload,
            kind=base.kind,
            configs=base.configs,
            resources=resources,
            throughput=throughput,
            features=features,
            estimated=~measured_mask,
            hardware=signature,
            throughput_unit=base.throughput_unit,
            param_count=base.param_count,
        )
