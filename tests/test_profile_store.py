"""The SQLite profile store: measured profiles win, gaps are estimated, stale rows go."""

from __future__ import annotations

import sqlite3
import time

import numpy as np
import pytest

from elastico_extender.errors import InvalidProfileError, ProfileStoreError
from elastico_extender.profiles import ProfileStore


@pytest.fixture
def store(tmp_path):
    db = ProfileStore(tmp_path / "profiles.sqlite")
    yield db
    db.close()


def test_profiles_persist_in_a_real_sqlite_file(tmp_path, families):
    path = tmp_path / "p.sqlite"
    fam = families["resnet50"]
    first = ProfileStore(path)
    first.put(
        "resnet50",
        fam.hardware,
        fam.configs[0],
        fam.resources[0],
        123.0,
        fam.features[0],
        measured_at=10.0,
    )
    first.close()
    rows = sqlite3.connect(path).execute("SELECT workload, throughput FROM profiles").fetchall()
    assert rows == [("resnet50", 123.0)]
    again = ProfileStore(path)
    assert again.records("resnet50", fam.hardware)[0].throughput == 123.0
    again.close()


def test_measured_rows_take_precedence_and_the_rest_are_estimated(store, families):
    fam = families["resnet50"]
    measured = [0, 5, 11]
    for row in measured:
        store.put(
            "resnet50",
            fam.hardware,
            fam.configs[row],
            fam.resources[row] * 1.1,
            fam.throughput[row] * 0.8,
        )
    merged = store.family(fam)
    assert merged.estimated.sum() == fam.size - len(measured)
    for row in measured:
        assert not merged.estimated[row]
        assert merged.throughput[row] == pytest.approx(fam.throughput[row] * 0.8)
        assert np.allclose(merged.resources[row], fam.resources[row] * 1.1)
    # Estimates borrow the nearest measurement's level (here 0.8x the catalog model).
    missing = np.flatnonzero(merged.estimated)
    assert np.allclose(merged.throughput[missing], fam.throughput[missing] * 0.8)


def test_without_measurements_the_base_family_is_returned(store, families):
    fam = families["bert"]
    assert store.family(fam) is fam


def test_profiles_are_keyed_by_hardware_and_invalidated_on_change(store, families):
    fam = families["dcgan"]
    store.put("dcgan", "A100-SXM4-40GB", fam.configs[0], fam.resources[0], 1.0)
    store.put("dcgan", "H100-SXM5-80GB", fam.configs[0], fam.resources[0], 2.0)
    assert store.family(fam, "H100-SXM5-80GB").throughput[0] == 2.0
    removed = store.keep_only_hardware({"H100-SXM5-80GB"})
    assert removed == 1
    assert store.records("dcgan", "A100-SXM4-40GB") == []
    assert store.invalidate(workload="dcgan") == 1


@pytest.mark.parametrize(
    ("resources", "throughput"),
    [
        ([0.5, float("nan"), 1, 1], 1.0),
        ([0.5, -1, 1, 1], 1.0),
        ([0.5, 1, 1, 1], 0.0),
        ([0.5, 1, 1], 1.0),
    ],
)
def test_bad_measurements_are_refused(store, families, resources, throughput):
    fam = families["lstm"]
    with pytest.raises(InvalidProfileError):
        store.put("lstm", fam.hardware, fam.configs[0], np.array(resources), throughput)
    assert store.records("lstm", fam.hardware) == []


def test_unopenable_store_raises_a_clear_error(tmp_path):
    with pytest.raises(ProfileStoreError, match="cannot open"):
        ProfileStore(tmp_path / "missing-dir" / "p.sqlite")


def test_rows_of_families_come_and_gone_are_bounded_in_the_file(tmp_path, families):
    """Every unprofiled family ever seen leaves a measured row (``profiles/observed``) and
    family names churn forever: the file keeps the newest ``capacity`` rows, across
    restarts too (a restart between every write, as a rarely written store sees)."""
    path = tmp_path / "p.sqlite"
    fam = families["dcgan"]
    for k in range(12):
        store = ProfileStore(path, capacity=5)
        store.put(f"family-{k}", fam.hardware, fam.configs[0], fam.resources[0], 1.0 + k,
                  measured_at=100.0 + k)  # fmt: skip
        store.close()
    store = ProfileStore(path, capacity=5)
    rows = sqlite3.connect(path).execute("SELECT workload FROM profiles").fetchall()
    assert {w for (w,) in rows} == {f"family-{k}" for k in range(7, 12)}
    assert store.records("family-11", fam.hardware)[0].throughput == 12.0
    assert store.records("family-0", fam.hardware) == []
    store.close()


def test_a_store_opens_while_another_process_writes_it(tmp_path, families):
    """During a rollout the old and the new process hold the same file: opening it takes
    no write lock (the other's long write neither blocks nor fails the start)."""
    path = tmp_path / "p.sqlite"
    fam = families["dcgan"]
    first = ProfileStore(path, capacity=5)
    for k in range(5):
        first.put(f"family-{k}", fam.hardware, fam.configs[0], fam.resources[0], 1.0)
    first.close()
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the other process's write transaction, in flight
    try:
        started = time.monotonic()
        store = ProfileStore(path, capacity=5)
        assert time.monotonic() - started < 2.0
        assert store.records("family-4", fam.hardware)[0].throughput == 1.0
        store.close()
    finally:
        other.execute("ROLLBACK")
        other.close()


_FOREIGN_PROFILES = [
    ("not json", "[1]", 5.0, None, 1.0),
    (None, "[" * 100_000, 5.0, None, 1.0),
    ('["a list"]', None, 5.0, None, 1.0),
    (None, "[1, 2]", 5.0, None, 1.0),  # resources of another length
    (None, None, "x", None, 1.0),
    (None, None, -3.0, None, 1.0),
    (None, "[NaN, 1, 1, 1]", 5.0, None, 1.0),
    (None, None, 5.0, "[1, 2]", 1.0),
    (None, None, 5.0, None, "yesterday"),
]


def test_rows_an_older_or_hostile_writer_left_are_skipped_not_fatal(tmp_path, families, caplog):
    """Profile rows this version would never write (a configuration that is not JSON, too
    few resources, a throughput of 'x' or -3): before, the family's first read raised
    JSONDecodeError or a shape error out of ``family`` (the service only catches
    ProfileStoreError there), or a negative throughput became the family's measured row.
    Now each is skipped with one warning naming the file, and the good rows still read."""
    path = tmp_path / "p.sqlite"
    fam = families["resnet50"]
    store = ProfileStore(path)
    store.put("resnet50", fam.hardware, fam.configs[0], fam.resources[0], 123.0, measured_at=1)
    good = sqlite3.connect(path).execute("SELECT * FROM profiles").fetchone()
    with sqlite3.connect(path) as db:
        for i, row in enumerate(_FOREIGN_PROFILES):
            config = row[0] if row[0] is not None else f'{{"foreign": {i}}}'
            values = [v if v is not None else good[k + 2] for k, v in enumerate(row)]
            values[0] = config
            db.execute(
                "INSERT INTO profiles VALUES (?,?,?,?,?,?,?)",
                ("resnet50", fam.hardware, *values),
            )
    with caplog.at_level("WARNING", logger="elastico_extender.profiles.store"):
        records = store.records("resnet50", fam.hardware)
        measured = store.family(fam)
    store.close()
    assert [r.throughput for r in records] == [123.0]
    assert measured.throughput[0] == 123.0 and np.isfinite(measured.throughput).all()
    warned = [r for r in caplog.records if r.msg == "profiles.foreign_rows"]
    assert warned and all(r.skipped == len(_FOREIGN_PROFILES) for r in warned)
    assert warned[0].path == str(path)
