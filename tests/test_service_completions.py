"""The extender learns expected run times from the cluster's finished pods (issue 14).

Real parts: the service's Engine and snapshot builder over the embedded cluster state,
pods in Kubernetes' JSON (status.startTime, containerStatuses[].state.terminated), the
SQLite completion store on disk.  Before this, the extender never set a job's expected
run time, so length-aware queueing fell back on attained service alone and the
share-or-wait rule never applied, while the simulator learned durations: the simulated
ElastiCo knew more than the shipped one.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.core.duration import MIN_HISTORY
from elastico_extender.profiles import completions as completion_store
from elastico_extender.profiles.completions import CompletionStore
from elastico_extender.service.completions import CompletionRecorder
from elastico_extender.service.engine import Engine
from elastico_extender.service.settings import ServiceSettings

DECISION_VOLUME = {"name": "elastico-decision", "downwardAPI": {"items": [
    {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}}  # fmt: skip


def gpu_node(name: str = "a", gpus: int = 4) -> dict:
    labels = {"nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.memory": "40960",
              "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}  # fmt: skip
    alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus), "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "resourceVersion": "1"},
            "spec": {}, "status": {"allocatable": alloc, "capacity": alloc}}  # fmt: skip


def pod(name: str, *, namespace: str = "team-a", family: str | None = "bert",
        phase: str = "Pending", ran_s: float | None = None) -> dict:  # fmt: skip
    annotations = {"elastico.io/family": family} if family else {}
    limits = {"nvidia.com/gpu": "1"}
    status: dict = {"phase": phase}
    if ran_s is not None:  # a finished pod: started at 10:00:00, its container ended ran_s later
        status["startTime"] = "2026-11-23T10:00:00Z"
        minutes, seconds = divmod(int(ran_s), 60)
        hours, minutes = divmod(minutes, 60)
        end = f"2026-11-23T{10 + hours:02d}:{minutes:02d}:{seconds:02d}Z"
        status["containerStatuses"] = [{"name": "m", "ready": False, "restartCount": 0,
            "image": "i", "imageID": "", "state": {"terminated": {
                "exitCode": 0 if phase == "Succeeded" else 1, "reason": "Completed",
                "startedAt": "2026-11-23T10:00:05Z", "finishedAt": end}}}]  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "resourceVersion": "1", "annotations": annotations},
            "spec": {"schedulerName": "elastico-scheduler",
                     "containers": [{"name": "m", "image": "i",
                                     "resources": {"limits": limits, "requests": limits}}],
                     "volumes": [DECISION_VOLUME]},
            "status": status}  # fmt: skip


def finished(count: int, ran_s: float, **kw: object) -> list[dict]:
    return [pod(f"done{k}", phase="Succeeded", ran_s=ran_s, **kw) for k in range(count)]  # type: ignore[arg-type]


def expected_of(engine: Engine, uid: str) -> tuple[float, str]:
    jobs = {j.id: j for j in engine.build_snapshot()[0].jobs}
    return jobs[uid].expected_duration_s, jobs[uid].user


def test_a_pending_pod_is_dated_by_the_pods_of_its_family_that_finished() -> None:
    cluster = EmbeddedCluster([gpu_node(), *finished(MIN_HISTORY, 7200.0), pod("new")], "t")
    engine = Engine(ServiceSettings(epoch_seconds=60), cluster)
    expected, user = expected_of(engine, "uid-new")
    assert expected == pytest.approx(7200.0, rel=0.35)
    assert user == "team-a"
    # what finished counts once, however many epochs the pods stay listed
    engine.build_snapshot()
    assert len(engine.builder.completions) == MIN_HISTORY  # type: ignore[arg-type]
    # and GET /jobs shows what the queue was told
    engine.run_epoch()
    row = next(r for r in engine.jobs() if r["id"] == "uid-new")
    assert row["expected_duration_s"] == pytest.approx(expected)


def test_too_few_completions_leave_the_queue_on_attained_service() -> None:
    cluster = EmbeddedCluster([gpu_node(), *finished(MIN_HISTORY - 1, 7200.0), pod("new")], "t")
    engine = Engine(ServiceSettings(epoch_seconds=60), cluster)
    assert expected_of(engine, "uid-new")[0] == 0.0


def test_only_elastico_pods_that_succeeded_with_both_times_count() -> None:
    no_end = pod("no-end", phase="Succeeded", ran_s=3600.0)
    no_end["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = "garbage"
    reversed_times = pod("reversed", phase="Succeeded", ran_s=3600.0)
    reversed_times["status"]["startTime"] = "2026-11-24T00:00:00Z"
    not_a_list = pod("odd", phase="Succeeded", ran_s=3600.0)
    not_a_list["status"]["containerStatuses"] = {"m": 1}
    others = [
        *[pod(f"failed{k}", phase="Failed", ran_s=3600.0) for k in range(MIN_HISTORY)],
        *[pod(f"plain{k}", family=None, phase="Succeeded", ran_s=3600.0) for k in range(3)],
        no_end, reversed_times, not_a_list,
        pod("bad", family="no such family!", phase="Succeeded", ran_s=3600.0),
    ]  # fmt: skip
    cluster = EmbeddedCluster([gpu_node(), *others, pod("new")], "t")
    engine = Engine(ServiceSettings(epoch_seconds=60), cluster)
    assert expected_of(engine, "uid-new")[0] == 0.0
    assert len(engine.builder.completions) == 0  # type: ignore[arg-type]
    engine.run_epoch()
    assert next(r for r in engine.jobs() if r["id"] == "uid-new")["expected_duration_s"] is None


def test_completions_survive_a_restart_and_are_not_counted_twice(tmp_path: Path) -> None:
    path = tmp_path / "profiles.db"
    objects = [gpu_node(), *finished(MIN_HISTORY, 1800.0), pod("new")]
    store = CompletionStore(path)
    Engine(ServiceSettings(epoch_seconds=60), EmbeddedCluster(copy.deepcopy(objects), "t"),
           completions=CompletionRecorder(store)).build_snapshot()  # fmt: skip
    store.close()
    # restarted, and the finished pods are gone from the API server: still known
    store = CompletionStore(path)
    engine = Engine(ServiceSettings(epoch_seconds=60), EmbeddedCluster([gpu_node(), pod("new")],
                    "t"), completions=CompletionRecorder(store))  # fmt: skip
    assert expected_of(engine, "uid-new")[0] == pytest.approx(1800.0, rel=0.35)
    # restarted with them still listed: the same pods are not learned from twice
    recorder = CompletionRecorder(store)
    engine = Engine(ServiceSettings(epoch_seconds=60), EmbeddedCluster(objects, "t"),
                    completions=recorder)  # fmt: skip
    engine.build_snapshot()
    assert len(recorder) == MIN_HISTORY
    assert len(store.load()) == MIN_HISTORY
    store.close()


def test_the_store_keeps_the_newest_completions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from elastico_extender.core.duration import CompletedJob

    monkeypatch.setattr(completion_store, "PRUNE_EVERY", 2)
    store = CompletionStore(tmp_path / "c.db", capacity=3)
    for k in range(6):
        assert store.add(f"u{k}", CompletedJob("bert", 1, 100.0 + k, "t"), finished_at=1e9 + k)
    assert not store.add("u5", CompletedJob("bert", 1, 1.0, "t"), finished_at=0.0)
    kept = store.load()
    assert [uid for uid, _, _ in kept] == ["u3", "u4", "u5"]
    assert [c.duration_s for _, c, _ in kept] == [103.0, 104.0, 105.0]
    store.close()


def test_a_store_restarted_before_it_prunes_still_keeps_only_the_newest(tmp_path: Path) -> None:
    """A small cluster restarted (rolled out) every few hundred completions never reaches
    ``PRUNE_EVERY`` in one run: the file is bounded all the same."""
    import sqlite3

    from elastico_extender.core.duration import CompletedJob

    path = tmp_path / "c.db"
    for k in range(6):
        store = CompletionStore(path, capacity=3)
        assert store.add(f"u{k}", CompletedJob("bert", 1, 100.0 + k, "t"), finished_at=1e9 + k)
        store.close()
        held = sqlite3.connect(path).execute("SELECT COUNT(*) FROM job_completions").fetchone()
        assert held[0] <= 3 + 1  # the bound, and what this run added
    CompletionStore(path, capacity=3).close()  # the next restart
    rows = sqlite3.connect(path).execute("SELECT uid FROM job_completions").fetchall()
    assert sorted(uid for (uid,) in rows) == ["u3", "u4", "u5"]


def test_completion_rows_of_the_wrong_type_are_skipped_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows an older or hostile writer left (gpus 'x', finished_at 'later', a NaN run
    time): before, ``load`` raised "invalid literal for int()" and ``elastico serve``
    refused to start without naming the file.  Now they are skipped, with one warning
    naming the file and the count, and the good completions still load."""
    import sqlite3

    from elastico_extender.core.duration import CompletedJob

    path = tmp_path / "c.db"
    store = CompletionStore(path)
    store.add("u1", CompletedJob("bert", 1, 100.0, "t"), finished_at=5.0)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO job_completions VALUES ('u2', 'bert', 'x', 't', 100, 6)")
        db.execute("INSERT INTO job_completions VALUES ('u3', 'bert', 1, 't', 100, 'later')")
        db.execute("INSERT INTO job_completions VALUES ('u4', 'bert', 1, 't', 'NaN', 7)")
        db.execute("INSERT INTO job_completions VALUES ('u5', X'01', 1, 't', 100, 8)")
    with caplog.at_level("WARNING", logger="elastico_extender.profiles.completions"):
        rows = store.load()
    store.close()
    assert rows == [("u1", CompletedJob("bert", 1, 100.0, "t"), 5.0)]
    warned = [r for r in caplog.records if r.msg == "completions.foreign_rows"]
    assert [(r.path, r.skipped) for r in warned] == [(str(path), 4)]


def test_rows_with_no_time_never_crowd_out_learned_completions(tmp_path: Path) -> None:
    """SQLite sorts text above numbers: three rows finished 'later' were the newest, so a
    store keeping two read none of its two real completions, and pruning at open deleted
    them, keeping the foreign rows."""
    import sqlite3

    from elastico_extender.core.duration import CompletedJob

    path = tmp_path / "c.db"
    store = CompletionStore(path, capacity=5)
    store.add("u1", CompletedJob("bert", 1, 100.0, "t"), finished_at=5.0)
    store.add("u2", CompletedJob("ncf", 1, 50.0, "t"), finished_at=6.0)
    store.close()
    with sqlite3.connect(path) as db:
        for k in range(3):
            db.execute(f"INSERT INTO job_completions VALUES ('x{k}', 'bert', 1, 't', 1, 'later')")
    store = CompletionStore(path, capacity=2)  # prunes at open to two rows
    rows = store.load()
    store.close()
    assert [uid for uid, _, _ in rows] == ["u1", "u2"]
    with sqlite3.connect(path) as db:
        (left,) = db.execute("SELECT COUNT(*) FROM job_completions").fetchone()
    assert left == 2
