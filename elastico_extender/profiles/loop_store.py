"""What the closed loop learns, in SQLite, so a restart loses nothing (issue 11, Learn).

A sibling of :mod:`.store` (the profile store); by default the same file can
hold both (different tables).  Four tables:

* ``loop_correction``: the online correction's rows per level (configuration
  pair, family pair): 64-bit key (as text), mean log residual, capped count;
* ``loop_neighbours``: the correction's ring of observed configuration pairs
  (36 float32 features as a blob, mean log residual, count), oldest slot
  first, for its nearest-neighbour level;
* ``loop_samples``: labelled pair samples (36 float32 features as a blob, the
  observed slowdown, the driver's time), newest ``max_samples`` kept; the
  training set of ``elastico train-iac --from-store``;
* ``loop_references``: the observation book's solo reference rates per
  (job, configuration, unit), so slowdowns resume at once after a restart.

Writes are batched per call (one transaction); the store is thread-safe.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np

from elastico_extender.core.interference.features import NUM_FEATURES
from elastico_extender.core.interference.online import OnlineCorrection
from elastico_extender.core.observations import ObservationBook
from elastico_extender.profiles.store import open_database

__all__ = ["LoopStore"]

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
    job    TEXT NOT NULL,
    config INTEGER NOT NULL,
    unit   TEXT NOT NULL,
    rate   REAL NOT NULL,
    solo   INTEGER NOT NULL,       -- 1: measured alone, 0: a profile's T(c)
    PRIMARY KEY (job, config, unit)
);
"""


class LoopStore:
    """SQLite persistence of the online correction, pair samples and solo references."""

    def __init__(self, path: str | Path = ":memory:", max_samples: int = 200_000) -> None:
        if max_samples < 1:
            raise ValueError("max_samples must be >= 1")
        self.path = str(path)
        self.max_samples = max_samples
        self._db = open_database(self.path, _SCHEMA, "loop store")
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- correction ------------------------------------------------------------
    def save_correction(self, correction: OnlineCorrection) -> None:
        """Replace the stored correction by ``correction``'s rows (both levels and the ring)."""
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

    def load_correction(self, correction: OnlineCorrection) -> int:
        """Restore the stored rows into ``correction``; returns how many were read."""
        with self._lock:
            rows = self._db.execute(
                "SELECT level, key, mean, count FROM loop_correction ORDER BY rowid"
            ).fetchall()
            ring = self._db.execute(
                "SELECT key, features, mean, count FROM loop_neighbours ORDER BY slot"
            ).fetchall()
        for level in ("config", "family"):
            correction.restore_rows(
                level, ((int(k), float(m), float(n)) for lv, k, m, n in rows if lv == level)
            )
        correction.restore_neighbours(
            (int(k), np.frombuffer(blob, dtype="<f4"), float(m), float(n))
            for k, blob, m, n in ring
            if len(blob) == 4 * NUM_FEATURES
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
                "SELECT features, slowdown FROM loop_samples ORDER BY id"
            ).fetchall()
        x = np.zeros((len(rows), NUM_FEATURES), dtype=np.float32)
        y = np.zeros(len(rows))
        for k, (blob, s) in enumerate(rows):
            x[k] = np.frombuffer(blob, dtype="<f4")
            y[k] = s
        return x, y

    # -- observation references -------------------------------------------------------
    def save_references(self, book: ObservationBook) -> None:
        rows = [
            (str(j), int(str(c)), str(u), float(str(r)), int(str(m)))
            for j, c, u, r, m in book.state()["refs"]
            if math.isfinite(float(str(r)))
        ]
        with self._lock, self._db:
            self._db.execute("DELETE FROM loop_references")
            self._db.executemany("INSERT INTO loop_references VALUES (?,?,?,?,?)", rows)

    def load_references(self, book: ObservationBook) -> int:
        with self._lock:
            rows = self._db.execute(
                "SELECT job, config, unit, rate, solo FROM loop_references"
            ).fetchall()
        book.restore({"refs": [list(r) for r in rows]})
        return len(rows)
