"""Learned run times travel in the leader's checkpoint too ("everything learned survives a
restart").

Completions (``service/completions.py``) persist in each replica's pod-local SQLite file;
without a persistent volume a cluster whose replicas all restart would lose every learned
duration and its length-aware queue would start blind.  So the leader checkpoints them
with the loop's state (``profiles/loop_snapshot.py``, ``service/checkpoint.py``), and a
restore or a refresh merges them, each pod once.  Real parts: the fake API server, the
real kubernetes client, the service under uvicorn, SQLite on disk.
"""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kubernetes import client

from elastico_extender.cluster.fake_apiserver import FakeApiServer
from elastico_extender.core.duration import MIN_HISTORY, CompletedJob
from elastico_extender.core.interference.features import NUM_FEATURES
from elastico_extender.profiles.completions import CompletionStore
from elastico_extender.profiles.loop_snapshot import (
    FORMAT,
    CorruptSnapshot,
    LearnedState,
    decode,
    encode,
)
from elastico_extender.profiles.loop_store import PairRecord
from elastico_extender.service.completions import CompletionRecorder
from tests.test_learned_checkpoint import (
    CM,
    DATA_KEY,
    NS,
    Replica,
    api,  # noqa: F401  (the fixture)
    observation_service,
    payload_of,
    pending_pod,
    writer,
)
from tests.test_service_completions import pod
from tests.test_service_observations import wait_for

ROWS = [
    ("0b6f3c1e-8a52-4d1c-9f0e-3c2b1a0d9e8f", CompletedJob("bert", 1, 7200.0, "ml"), 1.7e9),
    ("uid-done1", CompletedJob("resnet50", 4, 1800.5, "team-a"), 1.7e9 + 60),
    ("uid-done2", CompletedJob("bert", 2, 61.0, "ml"), 1.7e9 + 120),
]

OLD_PAYLOAD = (
    "eJylk+FugjAQx/m2ZI/Rz1VbZM6ZZfoexiwdXJUIhbQlGzFL9mR7tl1VBMwAszVpSsP9f9e79n8gMtOpsGRBIBHGxmE2"
    "SkBoBdGEE0redWwtqFcXwR/ZafAxo0RoLUpDFgcSZkrG2/EeSreLbJkD4p6LOerNTrjd2t9QkklpADkoTkBt7Q6Rs09a"
    "6VMQqgWQQQeAz2rCvAaEWaHsbQQ/aBOkSOOk7C+BN/RT/1d9fwlNQNBoQlADBkpoEYI2Qcdq4A5YUz2v1axSf3RnZnQ6"
    "G5L3Vz+YfaD2Pr0RaZ6A+UcBFaHdPnlr+yq5sH/Ruw6ABA0qBHTUek2KOBoJQt0jEYUKd2AmhlDOGDqPbzYuPsx0dB3s"
    "vt4I9V3U+IFeDIsyJ9pDbmvDoguqd4eWOl3C0ZzNs/BLbedf57QczxzpLM8hahJZTWQdRNZBxDbcPzHvOO5OyxfOJS7f"
    "nrda4boMvct4wbn6AZOvbdI="
)
"""A checkpoint written by ``elastico-learned/1`` before completions were added (commit
19001e6): two configuration pairs, a family pair, a reference and a per-pod record."""


def test_completions_round_trip_through_encode_and_decode() -> None:
    state = LearnedState(config=[(7, 0.5, 2.0)], completions=list(ROWS))
    payload, kept, dropped = encode(state, 1 << 20)
    assert kept["completions"] == 3 and dropped["completions"] == 0
    back = decode(payload)
    assert back.completions == ROWS
    assert back.config == [(7, 0.5, 2.0)]


def test_a_checkpoint_written_before_completions_still_decodes() -> None:
    state = decode(base64.b64decode(OLD_PAYLOAD))
    assert FORMAT == "elastico-learned/1"  # no bump: the section is optional both ways
    assert [k for k, _, _ in state.config] == [12345, 2**63 + 7]
    assert state.references == [("uid-a", 0, "launches/s", 100.0, True)]
    assert state.records == [PairRecord("uid-a", 0, "uid-b", 2.0, 1.5, 1700000000.0)]
    assert state.completions == []


def test_an_older_leaders_checkpoint_still_restores(api: FakeApiServer) -> None:  # noqa: F811
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
    core.create_namespaced_config_map(NS, {"metadata": {"name": CM},
                                           "binaryData": {DATA_KEY: OLD_PAYLOAD}})  # fmt: skip
    svc, recorder = observation_service(1), CompletionRecorder()
    assert writer(api, svc, 0, completions=recorder).restore()
    assert len(recorder) == 0 and svc.book.state()["refs"]
    assert 12345 in {k for k, _, _ in svc.learned_state(0).config}


def tampered(change: Any) -> bytes:
    """A valid payload whose header's completions section was replaced by ``change``."""
    payload, _, _ = encode(LearnedState(completions=list(ROWS)), 1 << 20)
    line, _, body = zlib.decompress(payload).partition(b"\n")
    header = json.loads(line)
    header["completions"] = change(header["completions"])
    return zlib.compress(json.dumps(header).encode() + b"\n" + body)


def _row(field: int, value: Any) -> Any:
    def change(rows: list[list[Any]]) -> list[list[Any]]:
        rows[1][field] = value
        return rows

    return change


@pytest.mark.parametrize(
    "change",
    [
        lambda rows: {"not": "a list"},
        lambda rows: [*rows, "not a row"],
        lambda rows: [rows[0][:5], *rows[1:]],  # a field short
        lambda rows: [[*rows[0], 1], *rows[1:]],  # a field too many
        _row(0, 17),  # uid not a string
        _row(0, ""),
        _row(0, "u" * 300),
        _row(1, ""),  # no family
        _row(2, 1.5),  # GPUs not an integer
        _row(2, True),
        _row(2, -1),
        _row(3, None),  # user not a string
        _row(4, 0.0),  # a run time must be positive
        _row(4, -5.0),
        _row(4, float("inf")),
        _row(4, "7200"),
        _row(5, float("nan")),  # finish time
        _row(5, None),
    ],
)
def test_a_corrupt_completions_section_is_refused(change: Any) -> None:
    with pytest.raises(CorruptSnapshot):
        decode(tampered(change))


def test_the_bound_drops_completions_after_the_references_before_the_correction() -> None:
    """Trimming order: training history, then references, then completions (oldest
    first), then the correction: a long tail of departed pods' references must not crowd
    out the run times every queued job is dated by."""
    rng = np.random.default_rng(5)
    config = [(int(k), 0.3, 2.0) for k in rng.integers(1, 2**63, 500).tolist()]
    refs = [(f"pod-{i}", 0, "launches/s", 100.0 + i, True) for i in range(3000)]
    samples = (rng.random((500, NUM_FEATURES), dtype=np.float32), np.full(500, 1.5),
               np.arange(500.0))  # fmt: skip
    done = [
        (f"{rng.integers(2**62):016x}-{i}", CompletedJob("bert", 1 + i % 4, 60.0 + i, "ml"),
         1.7e9 + i)
        for i in range(3000)
    ]  # fmt: skip
    full = LearnedState(config=config, references=refs, samples=samples, completions=done)
    both, _, _ = encode(LearnedState(config=config, completions=done), 1 << 20)
    payload, kept, dropped = encode(full, len(both) + (8 << 10))
    assert len(payload) <= len(both) + (8 << 10)
    assert kept["samples"] == 0 and dropped["samples"] == 500
    assert 0 < kept["references"] < 3000 and kept["completions"] == 3000
    assert kept["config"] == 500
    alone, _, _ = encode(LearnedState(config=config), 1 << 20)
    bound = (len(alone) + len(both)) // 2
    payload, kept, dropped = encode(full, bound)
    assert len(payload) <= bound
    assert kept["references"] == 0 and kept["config"] == 500
    assert 0 < kept["completions"] < 3000 and dropped["completions"] == 3000 - kept["completions"]
    assert decode(payload).completions == done[-kept["completions"] :]


def test_a_checkpoints_completions_merge_once_per_pod(tmp_path: Path) -> None:
    """Merged rows a replica recorded itself, or merged before, are not counted again; the
    new ones reach the book and the SQLite file."""
    store = CompletionStore(tmp_path / "c.db")
    recorder = CompletionRecorder(store)
    assert recorder.merge(ROWS[:1]) == 1
    assert recorder.merge(ROWS) == 2 and recorder.merge(ROWS) == 0
    assert len(recorder) == 3 and recorder.rows(10) == ROWS and recorder.rows(1) == ROWS[-1:]
    assert [uid for uid, _, _ in store.load()] == [uid for uid, _, _ in ROWS]
    again = CompletionRecorder(store)  # restarted: what the store holds is known
    assert again.merge(ROWS) == 0 and len(again) == 3
    store.close()


def test_the_leader_writes_new_completions_and_a_follower_merges_each_pod_once(
    api: FakeApiServer,  # noqa: F811
) -> None:
    mine, theirs = CompletionRecorder(), CompletionRecorder()
    leader = writer(api, observation_service(1), 1, completions=mine)
    follower = writer(api, observation_service(2), 1, completions=theirs, is_leader=lambda: False)
    mine.merge(ROWS[:2])
    theirs.merge(ROWS[:1])  # the follower saw this pod finish itself
    assert leader.save() == "written" and follower.refresh() == "merged"
    assert theirs.rows(10) == ROWS[:2]
    assert leader.save() == "unchanged"
    mine.merge(ROWS[2:])  # only a completion is new: the leader writes all the same
    assert leader.save() == "written" and follower.refresh() == "merged"
    assert theirs.rows(10) == ROWS and len(theirs) == 3
    assert follower.refresh() == "unchanged"


def expected_duration(replica: Replica, uid: str) -> float:
    replica.epoch()
    jobs = {j.id: j for j in replica.engine.published.snapshot.jobs}
    return jobs[uid].expected_duration_s


def test_a_fresh_replica_restores_learned_run_times_from_the_checkpoint(
    api: FakeApiServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The leader learns run times from finished pods and checkpoints them (with nothing
    else learned); the pods are deleted, every replica restarts with an empty SQLite file,
    and the new leader's pending pod carries the expected run time."""
    count = MIN_HISTORY + 1
    for k in range(count):
        api.put("pods", pod(f"done{k}", namespace="ml", phase="Succeeded", ran_s=7200.0))
    api.put("pods", pending_pod("d"))
    a = Replica.start(api, "replica-a", tmp_path / "a.db")
    try:
        assert wait_for(a.elector.is_leader)
        assert wait_for(lambda: len(a.kube.state.pods()) == 4 + count)
        assert expected_duration(a, "uid-d") == pytest.approx(7200.0, rel=0.35)
        assert wait_for(lambda: (NS, CM) in api.configmaps)
        assert wait_for(lambda: len(decode(payload_of(api)).completions) == count)
    finally:
        a.server.stop()
    for k in range(1, count):  # gone from the API server; done0 is still listed
        api.delete("pods", f"ml/done{k}")
    z = Replica.start(api, "replica-z", tmp_path / "z.db")  # an empty SQLite file
    try:
        assert wait_for(z.elector.is_leader)
        assert wait_for(lambda: len(z.kube.state.pods()) == 5)
        assert expected_duration(z, "uid-d") == pytest.approx(7200.0, rel=0.35)
        assert len(z.engine.builder.completions) == count  # done0 counted once
        store = CompletionStore(tmp_path / "z.db")  # and its own file holds them now
        assert len(store.load()) == count
        store.close()
    finally:
        z.server.stop()
