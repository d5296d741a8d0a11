"""What the closed loop learns, in SQLite, so a restart loses nothing (issue 11, Learn).

The one store of the closed loop (the extender's and anyone else's): a sibling
of :mod:`.store` (the profile store); by default the same file holds both
(different tables).  Five tables:

* ``loop_references``: the observation book's solo reference rates per (job,
  configuration, unit), whether measured alone, and when written; upserted as
  they change, the newest read back at start so slowdowns resume at once; the
  newest ``max_references`` kept (every pod adds rows under its uid; pruned after
  each tenth of the bound written, and at open);
* ``loop_correction``: the online correction's rows per level (configuration
  pair, family pair): 64-bit key (as text), mean log residual, capped count;
* ``loop_neighbours``: the correction's ring of observed configuration pairs
  (36 float32 features as a blob, mean log residual, count), oldest slot
  first, for its nearest-neighbour level;
* ``loop_samples``: labelled pair samples (36 float32 features as a blob, the
  observed slowdown, the driver's time), newest ``max_samples`` kept; the
  training set of ``elastico train-iac --from-store``;
* ``pair_samples``: the record of every labelled window by job (victim,
  configuration, partner, observed and the plan's predicted slowdown), newest
  ``max_samples`` kept: what was observed against what was predicted.

A file written by the earlier separate observation store (its references in
``observation_refs``) is migrated when opened: the rows move into
``loop_references`` (as not measured alone: the old table did not say) and the
old table is dropped.

Writes are batched per call (one transaction); the store is thread-safe.
Rows read back that this version would not have written (another feature layout,
text or NaN where numbers belong: an older or hostile writer's) are skipped, and how
many per table is logged as ``loop_store.foreign_rows`` with the file.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from elastico_extender.core.interference.features import NUM_FEATURES
from elastico_extender.core.interference.online import OnlineCorrection
from elastico_extender.core.observations import ObservationBook
from elastico_extender.profiles.store import (
    finite_cell,
    is_number,
    keep_newest,
    keep_newest_at_open,
    kept_rows,
    newest_first,
    open_database,
)

__all__ = ["LoopStore", "PairRecord", "ReferenceRow"]

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS loop_correction (
    level TEXT NOT NULL,           -- 'config' or 'family'
    key   TEXT NOT NULL,           -- uint64 pair key, decimal
    mean  REAL NOT NULL,           -- mean log(S_observed / S_base)
    count REAL NOT NULL,           -- samples behind the mean (capped)
    PRIMARY KEY (level, key)
);
CREATE TABLE IF NOT EXISTS loop_neighbours (
    slot     INTEGER PRIMARY KEY,  -- oldest first
    key      TEXT NOT NULL,        -- uint64 configuration-pair key, decimal
    features BLOB NOT NULL,        -- 36 little-endian float32
    mean     REAL NOT NULL,
    count    REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS loop_samples (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    features    BLOB NOT NULL,     -- 36 little-endian float32, features.FEATURE_NAMES order
    slowdown    REAL NOT NULL,     -- observed S of the victim (first block)
    observed_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS loop_references (
    job        TEXT NOT NULL,
    config     INTEGER NOT NULL,
    unit       TEXT NOT NULL,
    rate       REAL NOT NULL,      -- solo progress rate, in ``unit``
    solo       INTEGER NOT NULL,   -- 1: measured alone, 0: a profile's T(c)
    updated_at REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (job, config, unit)
);
CREATE TABLE IF NOT EXISTS pair_samples (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    victim        TEXT NOT NULL,
    victim_config INTEGER NOT NULL,
    partner       TEXT NOT NULL,
    slowdown      REAL NOT NULL,   -- observed over one window
    predicted     REAL,            -- the plan's prediction for the victim then, or NULL
    end_time      REAL NOT NULL
);
"""

ReferenceRow = tuple[str, int, str, float, bool]
"""(job, configuration, unit, solo rate, measured alone)."""


@dataclass(frozen=True, slots=True)
class PairRecord:
    """One labelled window by job: observed against the plan's predicted slowdown."""

    victim: str
    victim_config: int
    partner: str
    slowdown: float
    predicted: float | None
    end: float


def _migrate(db: sqlite3.Connection) -> None:
    """Bring a file of an earlier layout to this one (module doc)."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(loop_references)")}
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    with db:
        if "updated_at" not in columns:
            db.execute("ALTER TABLE loop_references ADD COLUMN updated_at REAL NOT NULL DEFAULT 0")
        if "observation_refs" in tables:
            db.execute(
                "INSERT OR IGNORE INTO loop_references (job, config, unit, rate, solo, "
                "updated_at) SELECT job_id, config, unit, rate, 0, updated_at "
                "FROM observation_refs"
            )
            db.execute("DROP TABLE observation_refs")


def _is_features(blob: object) -> bool:
    """Whether a stored blob is one row of 36 float32 features (another version's layout,
    or a hand-edited file, is not read)."""
    return isinstance(blob, bytes) and len(blob) == 4 * NUM_FEATURES


def _is_key(value: object) -> bool:
    """Whether a stored key is a 64-bit pair key in decimal, as this version writes it."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= 20
        and value.isascii()
        and value.isdigit()
        and int(value) < 2**64
    )


def _is_reference(row: Sequence[object]) -> bool:
    job, config, unit, rate, solo = row
    return (
        isinstance(job, str)
        and isinstance(config, int)
        and isinstance(unit, str)
        and finite_cell(rate)
        and rate > 0
        and isinstance(solo, int)
    )


def _is_correction(row: Sequence[object]) -> bool:
    level, key, mean, count = row
    return (
        level in ("config", "family") and _is_key(key) and finite_cell(mean) and finite_cell(count)
    )


def _is_neighbour(row: Sequence[object]) -> bool:
    key, blob, mean, count = row
    return _is_key(key) and _is_features(blob) and finite_cell(mean) and finite_cell(count)


def _is_sample(row: Sequence[object]) -> bool:
    blob, slowdown, at = row
    return _is_features(blob) and finite_cell(slowdown) and slowdown >= 1 and finite_cell(at)


def _is_record(row: Sequence[object]) -> bool:
    victim, config, partner, slowdown, predicted, end = row
    return (
        isinstance(victim, str)
        and isinstance(config, int)
        and isinstance(partner, str)
        and finite_cell(slowdown)
        and (predicted is None or finite_cell(predicted))
        and finite_cell(end)
    )


def _decoded(
    kept: Sequence[tuple[bytes, float, float]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checked sample rows as arrays: features (n, 36) float32, slowdowns, when recorded."""
    x = np.frombuffer(b"".join(r[0] for r in kept), dtype="<f4").reshape(-1, NUM_FEATURES)
    return (
        x.astype(np.float32),
        np.array([r[1] for r in kept], dtype=np.float64),
        np.array([r[2] for r in kept], dtype=np.float64),
    )


class LoopStore:
    """SQLite persistence of the online correction, pair samples and solo references."""

    def __init__(
        self,
        path: str | Path = ":memory:",
        max_samples: int = 200_000,
        max_references: int = 200_000,
    ) -> None:
        if max_samples < 1 or max_references < 1:
            raise ValueError("max_samples and max_references must be >= 1")
        self.path = str(path)
        self.max_samples = max_samples
        self.max_references = max_references
        """References kept (the observation book's own bound: no more are read back)."""
        self._refs_since_prune = 0
        self._db = open_database(self.path, _SCHEMA, "loop store", _migrate)
        self._lock = threading.Lock()
        keep_newest_at_open(
            self._db, "loop_references", "updated_at", self.max_references,
            "loop_store.not_pruned", self.path,
        )  # fmt: skip

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- correction ------------------------------------------------------------
    def save_correction(
        self, correction: OnlineCorrection, guard: AbstractContextManager[object] | None = None
    ) -> None:
        """Replace the stored correction by ``correction``'s rows (both levels and the ring).

        ``guard`` (the lock its learner holds while it changes) is held while the rows are
        read, not while they are written: a slow disk never stalls the correction's users."""
        with guard if guard is not None else nullcontext():
            rows = [
                (level, str(key), mean, count)
                for level in ("config", "family")
                for key, mean, count in correction.rows(level)
            ]
            ring = [
                (slot, str(key), np.asarray(x, dtype="<f4").tobytes(), float(mean), float(count))
                for slot, (key, x, mean, count) in enumerate(correction.neighbour_rows())
            ]
        with self._lock, self._db:
            self._db.execute("DELETE FROM loop_correction")
            self._db.executemany("INSERT INTO loop_correction VALUES (?,?,?,?)", rows)
            self._db.execute("DELETE FROM loop_neighbours")
            self._db.executemany("INSERT INTO loop_neighbours VALUES (?,?,?,?,?)", ring)

    def _kept(self, rows: list[Any], usable: Callable[[Any], bool], table: str) -> list[Any]:
        """``rows`` of ``table`` this version would have written (:func:`kept_rows`)."""
        return kept_rows(rows, usable, log, "loop_store.foreign_rows", path=self.path, table=table)

    def load_correction(self, correction: OnlineCorrection) -> int:
        """Restore the stored rows into ``correction``; returns how many were read."""
        with self._lock:
            rows = self._db.execute(
                "SELECT level, key, mean, count FROM loop_correction ORDER BY rowid"
            ).fetchall()
            ring = self._db.execute(
                "SELECT key, features, mean, count FROM loop_neighbours ORDER BY slot"
            ).fetchall()
        rows = self._kept(rows, _is_correction, "loop_correction")
        ring = self._kept(ring, _is_neighbour, "loop_neighbours")
        for level in ("config", "family"):
            correction.restore_rows(
                level, ((int(k), float(m), float(n)) for lv, k, m, n in rows if lv == level)
            )
        correction.restore_neighbours(
            (int(k), np.frombuffer(blob, dtype="<f4"), float(m), float(n)) for k, blob, m, n in ring
        )
        return len(rows)

    # -- samples -------------------------------------------------------------------
    def add_samples(self, features: np.ndarray, slowdown: np.ndarray, at: float) -> int:
        """Append labelled rows (finite S >= 1 only); keeps the newest ``max_samples``."""
        x = np.ascontiguousarray(features, dtype="<f4")
        y = np.asarray(slowdown, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != NUM_FEATURES or y.shape != (x.shape[0],):
            raise ValueError(f"expected features (P, {NUM_FEATURES}) and slowdown (P,)")
        ok = np.isfinite(y) & (y >= 1.0) & np.isfinite(x).all(axis=1)
        rows = [(x[k].tobytes(), float(y[k]), float(at)) for k in np.flatnonzero(ok).tolist()]
        if not rows:
            return 0
        with self._lock, self._db:
            self._db.executemany(
                "INSERT INTO loop_samples (features, slowdown, observed_at) VALUES (?,?,?)", rows
            )
            self._db.execute(
                "DELETE FROM loop_samples WHERE id <= (SELECT MAX(id) FROM loop_samples) - ?",
                (self.max_samples,),
            )
        return len(rows)

    def samples(self) -> tuple[np.ndarray, np.ndarray]:
        """Every stored sample: features (n, 36) float32 and slowdowns (n,)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT features, slowdown, observed_at FROM loop_samples ORDER BY id"
            ).fetchall()
        x, y, _ = _decoded(self._kept(rows, _is_sample, "loop_samples"))
        return x, y

    def recent_samples(self, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The newest ``limit`` samples, oldest first: features, slowdowns, when recorded."""
        with self._lock:
            rows = self._db.execute(
                "SELECT features, slowdown, observed_at FROM loop_samples ORDER BY id DESC LIMIT ?",
                (max(0, limit),),
            ).fetchall()
        rows.reverse()
        return _decoded(self._kept(rows, _is_sample, "loop_samples"))

    def merge_history(
        self, samples: tuple[np.ndarray, np.ndarray, np.ndarray], records: Sequence[PairRecord]
    ) -> tuple[int, int]:
        """Append another replica's samples and per-pod records that are newer than any this
        store holds (so merging the same checkpoint twice adds nothing); returns how many."""
        x, y, at = samples
        with self._lock:
            # numbers only: SQLite sorts text (a foreign row's) above every number
            newest_sample = self._db.execute(
                f"SELECT MAX(observed_at) FROM loop_samples WHERE {is_number('observed_at')}"
            ).fetchone()
            newest_record = self._db.execute(
                f"SELECT MAX(end_time) FROM pair_samples WHERE {is_number('end_time')}"
            ).fetchone()
        cut = float("-inf") if newest_sample[0] is None else float(newest_sample[0])
        xs = np.ascontiguousarray(x, dtype="<f4").reshape(-1, NUM_FEATURES)
        ys, ts = np.asarray(y, dtype=np.float64), np.asarray(at, dtype=np.float64)
        ok = (ts > cut) & np.isfinite(ys) & (ys >= 1.0) & np.isfinite(xs).all(axis=1)
        rows = [(xs[k].tobytes(), float(ys[k]), float(ts[k])) for k in np.flatnonzero(ok).tolist()]
        if rows:
            with self._lock, self._db:
                self._db.executemany(
                    "INSERT INTO loop_samples (features, slowdown, observed_at) VALUES (?,?,?)",
                    rows,
                )
                self._db.execute(
                    "DELETE FROM loop_samples WHERE id <= (SELECT MAX(id) FROM loop_samples) - ?",
                    (self.max_samples,),
                )
        added = len(rows)
        cut = float("-inf") if newest_record[0] is None else float(newest_record[0])
        fresh = [r for r in records if r.end > cut]
        self.add_pair_records(fresh)
        return added, len(fresh)

    # -- observation references -------------------------------------------------------
    def put_references(self, rows: Iterable[ReferenceRow], at: float) -> int:
        """Upsert reference rows (finite, positive rates only); returns how many."""
        data = [
            (str(j), int(c), str(u), float(r), int(bool(solo)), float(at))
            for j, c, u, r, solo in rows
            if math.isfinite(float(r)) and float(r) > 0
        ]
        if data:
            with self._lock, self._db:
                self._db.executemany(
                    "INSERT INTO loop_references VALUES (?,?,?,?,?,?) "
                    "ON CONFLICT(job, config, unit) DO UPDATE SET rate=excluded.rate, "
                    "solo=MAX(solo, excluded.solo), updated_at=excluded.updated_at",
                    data,
                )
                # pruned after each tenth of the bound written: at most that much more kept
                self._refs_since_prune += len(data)
                if self._refs_since_prune >= max(1, self.max_references // 10):
                    self._refs_since_prune = 0
                    keep_newest(self._db, "loop_references", "updated_at", self.max_references)
        return len(data)

    def save_references(self, book: ObservationBook, at: float) -> int:
        """Upsert every reference ``book`` holds (a driver that keeps its book whole)."""
        return self.put_references(
            (
                (str(j), int(str(c)), str(u), float(str(r)), bool(int(str(m))))
                for j, c, u, r, m in book.state()["refs"]
            ),
            at,
        )

    def load_references(self, book: ObservationBook) -> int:
        """Restore the newest ``book.max_refs`` references into ``book`` (oldest first)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT job, config, unit, rate, solo FROM loop_references "
                f"ORDER BY {newest_first('updated_at')}, rowid DESC LIMIT ?",
                (book.max_refs,),
            ).fetchall()
        rows = self._kept(rows, _is_reference, "loop_references")
        book.restore({"refs": [list(r) for r in reversed(rows)]})
        return len(rows)

    # -- observed against predicted, by job ---------------------------------------------
    def add_pair_records(self, records: Sequence[PairRecord]) -> None:
        """Append labelled windows by job; keeps the newest ``max_samples``."""
        if not records:
            return
        with self._lock, self._db:
            self._db.executemany(
                "INSERT INTO pair_samples (victim, victim_config, partner, slowdown, predicted, "
                "end_time) VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (r.victim, r.victim_config, r.partner, r.slowdown, r.predicted, r.end)
                    for r in records
                ],
            )
            self._db.execute(
                "DELETE FROM pair_samples WHERE id <= (SELECT MAX(id) FROM pair_samples) - ?",
                (self.max_samples,),
            )

    def pair_records(self, limit: int = 10_000) -> list[PairRecord]:
        """The newest ``limit`` labelled windows by job, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT victim, victim_config, partner, slowdown, predicted, end_time "
                "FROM pair_samples ORDER BY id DESC LIMIT ?",
                (limit,),
            ).fetchall()
        rows = self._kept(rows, _is_record, "pair_samples")
        return [PairRecord(*row) for row in reversed(rows)]
