"""What the closed loop learns, kept in SQLite so a restart loses nothing (issue 11).

Two tables beside the profile store's (same file by default, or a file of their own):

* ``observation_refs``: the :class:`~elastico_extender.core.observations.ObservationBook`'s
  solo reference rates, one row per (job, configuration, unit), written as they change;
  at start-up they are read back with ``ObservationBook.restore`` (the book's own format).
* ``pair_samples``: every labelled co-location window (victim, configuration, partner,
  observed slowdown, the plan's predicted slowdown, end time), newest ``max_samples`` kept:
  the training data of an online correction or of ``train-iac``.

The book stays the one place where rates become slowdowns; this module only stores.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from elastico_extender.profiles.store import open_database

__all__ = ["ObservationStore", "StoredSample"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS observation_refs (
    job_id     TEXT NOT NULL,
    config     INTEGER NOT NULL,
    unit       TEXT NOT NULL,
    rate       REAL NOT NULL,      -- solo progress rate, in ``unit``
    updated_at REAL NOT NULL,      -- seconds since the epoch
    PRIMARY KEY (job_id, config, unit)
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


@dataclass(frozen=True, slots=True)
class StoredSample:
    victim: str
    victim_config: int
    partner: str
    slowdown: float
    predicted: float | None
    end: float


class ObservationStore:
    """Thread-safe SQLite store of reference rates and pair samples."""

    def __init__(self, path: str | Path = ":memory:", *, max_samples: int = 200_000) -> None:
        self.path = str(path)
        self.max_samples = max_samples
        self._db = open_database(self.path, _SCHEMA, "observation store")
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def put_references(self, rows: Iterable[tuple[str, int, str, float]], at: float) -> None:
        """Upsert ``(job_id, config, unit, rate)`` rows."""
        data = [(j, int(c), u, float(r), at) for j, c, u, r in rows]
        if not data:
            return
        with self._lock, self._db:
            self._db.executemany(
                "INSERT INTO observation_refs VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(job_id, config, unit) DO UPDATE SET rate=excluded.rate, "
                "updated_at=excluded.updated_at",
                data,
            )

    def book_state(self, limit: int = 200_000) -> dict[str, list[list[object]]]:
        """The newest ``limit`` references in ``ObservationBook.state()``'s format, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT job_id, config, unit, rate FROM observation_refs "
                "ORDER BY updated_at DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return {"refs": [list(r) for r in reversed(rows)]}

    def add_samples(self, samples: Sequence[StoredSample]) -> None:
        if not samples:
            return
        with self._lock, self._db:
            self._db.executemany(
                "INSERT INTO pair_samples (victim, victim_config, partner, slowdown, predicted, "
                "end_time) VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (s.victim, s.victim_config, s.partner, s.slowdown, s.predicted, s.end)
                    for s in samples
                ],
            )
            self._db.execute(
                "DELETE FROM pair_samples WHERE id <= (SELECT MAX(id) FROM pair_samples) - ?",
                (self.max_samples,),
            )

    def samples(self, limit: int = 10_000) -> list[StoredSample]:
        """The newest ``limit`` pair samples, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT victim, victim_config, partner, slowdown, predicted, end_time "
                "FROM pair_samples ORDER BY id DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [StoredSample(*row) for row in reversed(rows)]
