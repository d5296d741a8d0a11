"""What the closed loop learns survives a restart (SQLite), and trains the DNN (--from-store)."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from elastico_extender.core.interference.features import pair_features
from elastico_extender.core.interference.online import OnlineCorrection
from elastico_extender.core.interference.predictor import ContentionPredictor
from elastico_extender.core.observations import Observation, ObservationBook
from elastico_extender.profiles.loop_store import LoopStore, PairRecord


def test_correction_round_trip_through_sqlite(tmp_path, families):
    path = tmp_path / "loop.sqlite"
    learned = OnlineCorrection(ContentionPredictor())
    x = np.concatenate(
        [
            pair_features(families["bert"].features[[0]], families["resnet50"].features[[0]], 40),
            pair_features(families["dcgan"].features[[1]], families["lstm"].features[[0]], 40),
        ]
    )
    for _ in range(5):
        learned.learn(x, [2.2, 1.7])
    store = LoopStore(path)
    store.save_correction(learned)
    store.close()

    restarted = OnlineCorrection(ContentionPredictor())
    assert restarted.predict(x)[0] != pytest.approx(learned.predict(x)[0])
    reopened = LoopStore(path)
    assert reopened.load_correction(restarted) == 4  # two config pairs + two family pairs
    np.testing.assert_allclose(restarted.predict(x), learned.predict(x))
    reopened.close()


def test_references_and_samples_round_trip(tmp_path):
    path = tmp_path / "loop.sqlite"
    book = ObservationBook()
    book.record(Observation("a", 2, 5.0, 5.0, 120.0))  # alone: a measured reference
    book.set_reference("b", 0, "tokens/s", 900.0)  # a profile's T(c)
    store = LoopStore(path, max_samples=3)
    assert store.save_references(book, at=3.0) == 2
    x = np.arange(5 * 36, dtype=np.float32).reshape(5, 36)
    assert store.add_samples(x, np.array([1.2, np.nan, 1.4, 1.5, 1.6]), at=7.0) == 4
    store.close()

    fresh = ObservationBook()
    reopened = LoopStore(path, max_samples=3)
    assert reopened.load_references(fresh) == 2
    assert fresh.reference("a", 2, "launches/s") == pytest.approx(120.0)
    fresh.record(Observation("a", 2, 10.0, 5.0, 60.0, partners=("b",)))
    assert fresh.observed()["a"].slowdown == pytest.approx(2.0)
    assert fresh.observed()["a"].solo_reference
    xs, ys = reopened.samples()
    np.testing.assert_allclose(ys, [1.4, 1.5, 1.6])  # only the newest max_samples kept
    np.testing.assert_array_equal(xs[0], x[2])
    reopened.close()


def test_bad_sample_shapes_are_refused(tmp_path):
    store = LoopStore(tmp_path / "s.sqlite")
    with pytest.raises(ValueError, match="features"):
        store.add_samples(np.zeros((2, 35)), np.ones(2), at=0.0)
    store.close()


def test_train_iac_from_store_trains_a_servable_model_on_observed_pairs(tmp_path, capsys, families):
    pytest.importorskip("torch")
    from elastico_extender.interference.onnx_predictor import OnnxSlowdownPredictor
    from elastico_extender.interference.train import main

    names = sorted(families)
    rng = np.random.default_rng(0)
    victims = [families[names[i % len(names)]].features[0] for i in range(64)]
    partners = [families[names[(i * 5 + 3) % len(names)]].features[0] for i in range(64)]
    x = pair_features(np.stack(victims), np.stack(partners), 40.0)
    y = 1.0 + rng.uniform(0.1, 1.0, 64)
    path = tmp_path / "loop.sqlite"
    store = LoopStore(path)
    store.add_samples(x, y, at=1.0)
    store.close()
    out = tmp_path / "cluster.onnx"
    argv = ["--from-store", str(path), "--out", str(out), "--epochs", "2", "--hidden", "8"]
    assert main(argv) == 0
    assert "64 observed pair samples" in capsys.readouterr().out
    assert OnnxSlowdownPredictor(out).predict(x).min() >= 1.0


def test_train_iac_from_store_refuses_a_store_without_enough_samples(tmp_path, capsys):
    pytest.importorskip("torch")
    from elastico_extender.interference.train import main

    path = tmp_path / "empty.sqlite"
    LoopStore(path).close()
    assert main(["--from-store", str(path), "--out", str(tmp_path / "m.onnx")]) == 2
    assert "observed pair samples" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["--from-store", str(tmp_path / "missing.sqlite"), "--out", str(tmp_path / "x")])
    assert exit_info.value.code == 2
    assert "--from-store" in capsys.readouterr().err


def test_a_restart_keeps_the_nearest_neighbour_answer(tmp_path, families):
    base = ContentionPredictor()
    learned = OnlineCorrection(base)
    x = pair_features(families["bert"].features[[0]], families["resnet50"].features[[0]], 40)
    for _ in range(10):
        learned.learn(x, base.predict(x) * 1.8)
    near = x.copy()
    near[:, [6, 20]] += 0.01  # a family pair never observed, next to the observed one
    answer = learned.predict(near)
    assert answer[0] > base.predict(near)[0] * 1.3
    store = LoopStore(tmp_path / "loop.sqlite")
    store.save_correction(learned)
    store.close()

    restarted = OnlineCorrection(ContentionPredictor())
    reopened = LoopStore(tmp_path / "loop.sqlite")
    reopened.load_correction(restarted)
    reopened.close()
    np.testing.assert_allclose(restarted.predict(near), answer)


def test_references_written_as_they_change_restore_a_book(tmp_path: Path) -> None:
    path = tmp_path / "loop.db"
    store = LoopStore(path)
    book = ObservationBook(smoothing=1.0)
    book.record(Observation("a", 3, 10.0, 5.0, 400.0))
    book.record(Observation("a", 3, 15.0, 5.0, 500.0, "launches/s"))
    rate = book.reference("a", 3, "launches/s") or 0.0
    assert store.put_references([("a", 3, "launches/s", rate, True)], 15.0) == 1
    store.put_references([("b", 0, "tokens/s", 90.0, False), ("c", 0, "x", math.nan, True)], 16.0)
    store.put_references([("a", 3, "launches/s", 450.0, False)], 17.0)  # stays measured
    store.close()
    again = ObservationBook()
    assert LoopStore(path).load_references(again) == 2
    assert again.reference("a", 3, "launches/s") == pytest.approx(450.0)
    assert again.reference("b", 0, "tokens/s") == pytest.approx(90.0)
    assert again.reference("a", 0, "launches/s") is None
    again.record(Observation("a", 3, 20.0, 5.0, 225.0, "launches/s", ("b",)))
    again.record(Observation("b", 0, 20.0, 5.0, 45.0, "tokens/s", ("a",)))
    assert again.observed()["a"].solo_reference  # measured alone, kept through the upsert
    assert not again.observed()["b"].solo_reference  # a profile's T(c)


def test_only_the_newest_references_are_read_back_into_a_bounded_book(tmp_path: Path) -> None:
    store = LoopStore(tmp_path / "loop.db")
    for i in range(5):
        store.put_references([(f"j{i}", 0, "launches/s", 10.0 + i, True)], float(i))
    book = ObservationBook(max_refs=2)
    assert store.load_references(book) == 2
    assert book.reference("j4", 0, "launches/s") == pytest.approx(14.0)
    assert book.reference("j2", 0, "launches/s") is None
    store.close()


def test_references_of_pods_come_and_gone_are_bounded_in_the_file(tmp_path: Path) -> None:
    """Every pod adds rows keyed by its uid; without a bound the table grew forever
    (every start sorting all of it to read back the newest)."""
    path = tmp_path / "loop.db"
    store = LoopStore(path, max_references=100)
    for i in range(1_000):  # 1,000 pods, one window each
        store.put_references([(f"pod-{i}", 0, "it/s", 10.0 + i, True)], float(i))
    store.close()
    (rows,) = sqlite3.connect(path).execute("SELECT COUNT(*) FROM loop_references").fetchone()
    assert rows <= 110  # the bound and at most a tenth more between two prunings
    book = ObservationBook()
    assert LoopStore(path).load_references(book) >= 100
    assert book.reference("pod-999", 0, "it/s") == pytest.approx(1009.0)  # the newest kept
    assert book.reference("pod-0", 0, "it/s") is None


def test_references_stay_bounded_when_restarts_come_before_a_pruning(tmp_path: Path) -> None:
    """Pruning waits for a tenth of the bound to be written, a count a restart starts
    afresh: a store restarted more often grew forever (pruned at open too now)."""
    path = tmp_path / "loop.db"
    for i in range(300):  # a restart after every pod's first window
        store = LoopStore(path, max_references=100)
        store.put_references([(f"pod-{i}", 0, "it/s", 10.0 + i, True)], float(i))
        store.close()
    (rows,) = sqlite3.connect(path).execute("SELECT COUNT(*) FROM loop_references").fetchone()
    assert rows <= 101  # the bound, and what the last run wrote


def test_pair_records_are_bounded_to_the_newest(tmp_path: Path) -> None:
    store = LoopStore(tmp_path / "loop.db", max_samples=5)
    for i in range(12):
        store.add_pair_records([PairRecord("a", 1, "b", 1.0 + i / 10, 1.2 if i % 2 else None, i)])
    kept = store.pair_records()
    assert [s.end for s in kept] == [7, 8, 9, 10, 11]
    assert kept[0] == PairRecord("a", 1, "b", pytest.approx(1.7), 1.2, 7)
    assert kept[1].predicted is None
    store.close()


def test_a_file_of_the_old_two_store_layout_is_migrated(tmp_path: Path) -> None:
    """References the earlier observation store wrote (``observation_refs``) and an
    earlier ``loop_references`` without ``updated_at`` are read by the one store."""
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE observation_refs (job_id TEXT NOT NULL, config INTEGER NOT NULL,
            unit TEXT NOT NULL, rate REAL NOT NULL, updated_at REAL NOT NULL,
            PRIMARY KEY (job_id, config, unit));
        CREATE TABLE loop_references (job TEXT NOT NULL, config INTEGER NOT NULL,
            unit TEXT NOT NULL, rate REAL NOT NULL, solo INTEGER NOT NULL,
            PRIMARY KEY (job, config, unit));
        INSERT INTO observation_refs VALUES ('old', 2, 'launches/s', 80.0, 5.0);
        INSERT INTO loop_references VALUES ('kept', 1, 'tokens/s', 70.0, 1);
        """
    )
    db.commit()
    db.close()
    store = LoopStore(path)
    book = ObservationBook()
    assert store.load_references(book) == 2
    assert book.reference("old", 2, "launches/s") == pytest.approx(80.0)
    assert book.reference("kept", 1, "tokens/s") == pytest.approx(70.0)
    store.close()
    tables = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}
    assert "observation_refs" not in tables  # one owner of the references from now on


def test_an_unopenable_store_is_a_clear_error(tmp_path: Path) -> None:
    from elastico_extender.errors import ProfileStoreError

    with pytest.raises(ProfileStoreError, match="cannot open loop store"):
        LoopStore(tmp_path / "missing-dir" / "loop.db")


def test_a_file_of_another_layout_is_refused_when_opened_not_when_written(
    tmp_path: Path,
) -> None:
    from elastico_extender.errors import ProfileStoreError

    path = tmp_path / "loop.db"
    LoopStore(path).close()
    db = sqlite3.connect(path)  # a newer layout, say: a column this version does not know
    db.execute("ALTER TABLE loop_correction ADD COLUMN weight REAL NOT NULL DEFAULT 1")
    db.commit()
    db.close()
    # before: opened, then every save of the correction failed ("table loop_correction
    # has 5 columns but 4 values were supplied"), so nothing learned was kept
    with pytest.raises(ProfileStoreError, match=r"loop\.db.*table loop_correction"):
        LoopStore(path)


def test_samples_of_another_feature_layout_are_skipped_not_fatal(tmp_path: Path) -> None:
    """A file whose sample rows hold another number of features (written by a version with
    another feature layout before a rollback, or edited by hand): before, reading the samples
    raised ValueError (the service's start and ``train-iac --from-store`` failed); now those
    rows are skipped, the others read in order."""
    path = tmp_path / "loop.db"
    store = LoopStore(path)
    x = np.arange(2 * 36, dtype=np.float32).reshape(2, 36)
    store.add_samples(x[:1], np.array([1.5]), 10.0)
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO loop_samples (features, slowdown, observed_at) VALUES (?,?,?)",
            (np.zeros(40, dtype="<f4").tobytes(), 2.0, 11.0),
        )
    store.add_samples(x[1:], np.array([1.8]), 12.0)
    features, slowdown = store.samples()
    assert features.shape == (2, 36) and slowdown.tolist() == [1.5, 1.8]
    assert (features == x).all()
    features, slowdown, at = store.recent_samples(3)
    assert (features == x).all() and slowdown.tolist() == [1.5, 1.8] and at.tolist() == [10, 12]


@pytest.mark.parametrize("rate", [math.inf, 0.0, -5.0], ids=["inf", "zero", "negative"])
def test_a_stored_solo_reference_without_a_usable_rate_is_skipped_whole(
    tmp_path: Path, rate: float
) -> None:
    """A reference row marked measured alone whose rate is no rate (an older or hostile
    writer's, or a checkpoint's 0): before, the book marked the key measured without
    keeping the rate, and the job's next window raised KeyError out of ``record``."""
    path = tmp_path / "loop.db"
    store = LoopStore(path)
    store.put_references([("b", 0, "launches/s", 50.0, True)], at=1.0)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO loop_references VALUES ('a', 2, 'launches/s', ?, 1, 2)", (rate,))
    book = ObservationBook()
    store.load_references(book)
    store.close()
    book.record(Observation("a", 2, 10.0, 5.0, 60.0, partners=("b",)))
    assert book.reference("a", 2, "launches/s") is None
    assert "a" in book.unmeasured()  # no reference: no slowdown, not a crash
    assert book.reference("b", 0, "launches/s") == pytest.approx(50.0)


def _store_with_a_correction(
    path: Path, families: dict
) -> tuple[np.ndarray, OnlineCorrection, LoopStore]:
    """A store at ``path`` holding a correction learned on one pair (bert next to
    resnet50, observed at 2.2 five times): the pair's features, the correction, the store."""
    x = pair_features(families["bert"].features[[0]], families["resnet50"].features[[0]], 40)
    learned = OnlineCorrection(ContentionPredictor())
    for _ in range(5):
        learned.learn(x, [2.2])
    store = LoopStore(path)
    store.save_correction(learned)
    return x, learned, store


@pytest.mark.parametrize("key", ["-1", str(2**64)], ids=["negative", "past-uint64"])
def test_a_stored_correction_key_outside_uint64_is_skipped(
    tmp_path: Path, families: dict, key: str
) -> None:
    """Pair keys are 64-bit hashes; a row holding another number (a hand-edited or hostile
    file): before, it was restored, and every prediction and learning step after raised
    OverflowError converting the table to uint64."""
    path = tmp_path / "loop.db"
    x, learned, store = _store_with_a_correction(path, families)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO loop_correction VALUES ('config', ?, 0.5, 3)", (key,))
        db.execute("INSERT INTO loop_correction VALUES ('family', ?, 0.5, 3)", (key,))
        blob = np.zeros(36, dtype="<f4").tobytes()
        db.execute("INSERT INTO loop_neighbours VALUES (99, ?, ?, 0.5, 3)", (key, blob))
    restarted = OnlineCorrection(ContentionPredictor())
    store.load_correction(restarted)
    store.close()
    np.testing.assert_allclose(restarted.predict(x), learned.predict(x))
    restarted.learn(x, [2.2])
    assert all(0 <= k < 2**64 for k, _, _, _ in restarted.neighbour_rows())


_FOREIGN_ROWS = {
    "loop_references": [
        "INSERT INTO loop_references VALUES ('x1', 'x', 'u', 3.0, 1, 5)",
        "INSERT INTO loop_references VALUES ('x2', 1, 'u', 3.0, 'yes', 5)",
        "INSERT INTO loop_references VALUES ('x3', 1, 'u', 'NaN', 0, 5)",
        "INSERT INTO loop_references VALUES (X'0102', 1, 7, 3.0, 0, 5)",
    ],
    "loop_correction": [
        "INSERT INTO loop_correction VALUES ('config', 'notanint', 0.5, 3)",
        "INSERT INTO loop_correction VALUES ('family', '12', 'nan', 'x')",
    ],
    "loop_neighbours": ["INSERT INTO loop_neighbours VALUES (7, 'zz', zeroblob(144), 'x', 1)"],
    "loop_samples": [
        "INSERT INTO loop_samples (features, slowdown, observed_at) VALUES (zeroblob(144), "
        "1.5, 'x')",
        "INSERT INTO loop_samples (features, slowdown, observed_at) VALUES (zeroblob(144), "
        "'nan', 2)",
        "INSERT INTO loop_samples (features, slowdown, observed_at) VALUES (zeroblob(144), 0.5, 2)",
    ],
    "pair_samples": [
        "INSERT INTO pair_samples (victim, victim_config, partner, slowdown, predicted, end_time) "
        "VALUES (1, 'x', 2, 'nan', 'q', 'z')",
    ],
}


def test_rows_of_the_wrong_type_are_skipped_and_counted_not_fatal(
    tmp_path: Path, families: dict, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows an older or hostile writer left with text where numbers belong (or NaN, or a
    slowdown below 1): before, restoring the references or the correction raised ValueError
    ("invalid literal for int()": ``elastico serve`` refused to start without naming the
    file), reading the samples raised (``train-iac --from-store`` and every checkpoint
    write failed) and the per-pod records came back as strings.  Now each such row is
    skipped, the good ones read, and one warning per table names the file and the count."""
    path = tmp_path / "loop.db"
    x, learned, store = _store_with_a_correction(path, families)
    store.put_references([("a", 2, "launches/s", 120.0, True)], at=1.0)
    store.add_samples(np.ones((1, 36), dtype=np.float32), np.array([1.5]), at=3.0)
    store.add_pair_records([PairRecord("a", 2, "b", 1.4, 1.3, 3.0)])
    with sqlite3.connect(path) as db:
        for statements in _FOREIGN_ROWS.values():
            for statement in statements:
                db.execute(statement)

    book, restarted = ObservationBook(), OnlineCorrection(ContentionPredictor())
    with caplog.at_level("WARNING", logger="elastico_extender.profiles.loop_store"):
        store.load_references(book)
        store.load_correction(restarted)
        features, slowdown = store.samples()
        _, _, at = store.recent_samples(10)
        records = store.pair_records()
        assert store.merge_history((np.ones((1, 36)), np.array([1.7]), np.array([4.0])), []) == (
            1,
            0,
        )  # newer than the newest numeric sample (3.0), not than the text 'x'
    store.close()
    assert book.state()["refs"] == [["a", 2, "launches/s", 120.0, 1]]
    np.testing.assert_allclose(restarted.predict(x), learned.predict(x))
    assert slowdown.tolist() == [1.5] and at.tolist() == [3.0] and features.shape == (1, 36)
    assert records == [PairRecord("a", 2, "b", 1.4, 1.3, 3.0)]
    skipped = {r.table: r.skipped for r in caplog.records if r.msg == "loop_store.foreign_rows"}
    assert skipped == {
        "loop_references": 4,
        "loop_correction": 2,
        "loop_neighbours": 1,
        "loop_samples": 3,
        "pair_samples": 1,
    }
    assert all(r.path == str(path) for r in caplog.records if r.msg == "loop_store.foreign_rows")
