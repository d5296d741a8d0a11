"""benchmarks/observation_ingest.py measures what it says: its pods are opted in through
the webhook, so every one is observed (a pod without the webhook's decision volume is
held as whole GPUs and the benchmark timed a book that learned nothing)."""

from __future__ import annotations

import pytest
from conftest import load_benchmark


@pytest.fixture()
def ingest(monkeypatch):
    return load_benchmark("observation_ingest", monkeypatch)


def test_every_pod_of_the_benchmark_is_observed_and_every_row_is_timed(ingest):
    rows = dict(ingest.run(pods=64, reps=1))  # asserts every pod has an observed slowdown
    assert set(rows) == {
        "ingest 8",
        "ingest 16",
        "for_snapshot",
        "snapshot +obs",
        "snapshot -obs",
        "POST 16",
    }
    assert all(wall >= 0 and cpu >= 0 for wall, cpu in rows.values())
