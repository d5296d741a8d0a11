"""Completed jobs in SQLite, so the duration estimates survive a restart (issue 14).

One table, ``job_completions``, in the profile store's file by default: per finished
pod (its uid is the key, so a pod still listed as Succeeded after a restart is not
counted twice) the family, GPU count, user (the namespace), run time and when it
finished.  The newest :data:`~elastico_extender.core.duration.MAX_COMPLETIONS` are kept
(pruned every :data:`PRUNE_EVERY` inserts and at open); :meth:`CompletionStore.load` reads
them back oldest first.  Thread-safe; each write is one transaction (a checkpoint's
thousands of rows too: :meth:`CompletionStore.add_many`).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from elastico_extender.core.duration import MAX_COMPLETIONS, CompletedJob
from elastico_extender.errors import ProfileStoreError
from elastico_extender.profiles.store import (
    finite_cell,
    keep_newest,
    keep_newest_at_open,
    kept_rows,
    newest_first,
    open_database,
)

__all__ = ["CompletionRow", "CompletionStore"]

log = logging.getLogger(__name__)

CompletionRow = tuple[str, CompletedJob, float]
"""(the pod's uid, its completion, when it finished in epoch seconds)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS job_completions (
    uid         TEXT PRIMARY KEY,  -- the pod's uid
    family      TEXT NOT NULL,
    gpus        INTEGER NOT NULL,
    user        TEXT NOT NULL,     -- the pod's namespace
    duration_s  REAL NOT NULL,     -- from status.startTime to its containers' last finishedAt
    finished_at REAL NOT NULL      -- epoch seconds
);
CREATE INDEX IF NOT EXISTS job_completions_finished ON job_completions (finished_at);
"""

PRUNE_EVERY = 1_000
"""Inserts between two prunings of rows beyond ``capacity`` (a delete per insert would
rewrite the index each time)."""


class CompletionStore:
    """The ``job_completions`` table (module docstring)."""

    def __init__(self, path: str | Path = ":memory:", capacity: int = MAX_COMPLETIONS) -> None:
        self.path = str(path)
        self.capacity = int(capacity)
        self._db = open_database(self.path, _SCHEMA, "completion store")
        self._lock = threading.Lock()
        self._since_prune = 0
        keep_newest_at_open(
            self._db, "job_completions", "finished_at", self.capacity, "completions.not_pruned",
            self.path,
        )  # fmt: skip

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def add(self, uid: str, job: CompletedJob, finished_at: float) -> bool:
        """Record ``uid``'s completion; False if it was recorded before."""
        return self.add_many([(uid, job, finished_at)]) == 1

    def add_many(self, rows: Iterable[CompletionRow]) -> int:
        """Record the completions in ``rows`` in one transaction; how many were new."""
        try:
            with self._lock, self._db:
                cursor = self._db.executemany(
                    "INSERT OR IGNORE INTO job_completions VALUES (?, ?, ?, ?, ?, ?)",
                    [
                        (uid, job.family, int(job.gpus), job.user, float(job.duration_s),
                         float(finished_at))
                        for uid, job, finished_at in rows
                    ],
                )  # fmt: skip
                added = max(cursor.rowcount, 0)  # summed over the rows; ignored ones add 0
                self._since_prune += added
                if self._since_prune >= PRUNE_EVERY:
                    self._prune()
        except sqlite3.Error as exc:
            raise ProfileStoreError(f"cannot write completion store {self.path}: {exc}") from exc
        return added

    def _prune(self) -> None:
        self._since_prune = 0
        keep_newest(self._db, "job_completions", "finished_at", self.capacity)

    def load(self) -> list[CompletionRow]:
        """The newest ``capacity`` rows, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT uid, family, gpus, user, duration_s, finished_at FROM job_completions "
                f"ORDER BY {newest_first('finished_at')} LIMIT ?",
                (self.capacity,),
            ).fetchall()
        kept = kept_rows(rows, _usable, log, "completions.foreign_rows", path=self.path)
        return [
            (uid, CompletedJob(f, int(g), float(d), u), float(at))
            for uid, f, g, u, d, at in reversed(kept)
        ]


def _usable(row: tuple[Any, ...]) -> bool:
    """Whether a stored row is one :meth:`CompletionStore.add` writes (an older or hostile
    writer's text where a number belongs, or NaN, is not): one such row must not stop the
    service from starting."""
    uid, family, gpus, user, duration, at = row
    return (
        all(isinstance(v, str) for v in (uid, family, user))
        and isinstance(gpus, int)
        and gpus >= 0
        and finite_cell(duration)
        and finite_cell(at)
    )
