"""What the closed loop learned survives a leader change and a full restart (issue 11).

Two extender replicas run under uvicorn on 127.0.0.1 with the real kubernetes client
against the project's fake API server; each has its own SQLite file, as pod-local storage
would be.  The leader checkpoints a bounded snapshot to the ``elastico-learned``
ConfigMap; a replica that becomes leader restores it before it leads.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from elastico_extender.api.app import create_app
from elastico_extender.cluster.fake_apiserver import FakeApiServer
from elastico_extender.cluster.kube import KubeCluster
from elastico_extender.core.closed_loop import ClosedLoop
from elastico_extender.core.interference.features import NUM_FEATURES
from elastico_extender.core.interference.online import OnlineCorrection
from elastico_extender.core.interference.predictor import ContentionPredictor
from elastico_extender.profiles.loop_snapshot import (
    CorruptSnapshot,
    LearnedState,
    decode,
    encode,
)
from elastico_extender.profiles.loop_store import LoopStore, PairRecord
from elastico_extender.service.checkpoint import DATA_KEY, FAILURE_REASONS, LearnedCheckpoint
from elastico_extender.service.leader import LeaderElector, LeaseTiming, elect
from elastico_extender.service.observations import ObservationService
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings
from tests.test_service_observations import (
    SOLO,
    _pair_features,
    batch,
    gpu_node,
    running_pod,
    wait_for,
    window,
)

NS = "elastico-system"
CM = "elastico-learned"
TIMING = LeaseTiming(lease_duration=1.5, renew_deadline=1.0, retry_period=0.1)


def pending_pod(name: str) -> dict:
    pod = running_pod(name, "g1", 0)
    pod["spec"].pop("nodeName")
    pod["status"] = {"phase": "Pending"}
    pod["metadata"]["annotations"] = {"elastico.io/family": "bert"}
    return pod


@dataclass
class Replica:
    """One extender replica: its own SQLite file, the Lease, the HTTP service."""

    server: ServerThread
    kube: KubeCluster
    elector: LeaderElector
    app: object
    token: str

    @classmethod
    def start(cls, api: FakeApiServer, identity: str, store: Path, **settings) -> Replica:
        conf = client.ApiClient(client.Configuration(host=api.url))
        kube = KubeCluster(conf, resync_seconds=300, watch_timeout_seconds=30)
        elector, gated = elect(
            kube, conf, name="elastico-extender", namespace=NS, identity=identity,
            timing=TIMING, label_pod=False,
        )  # fmt: skip
        merged = {"epoch_seconds": 3600, "observation_store": str(store), "identity": identity,
                  "lease_namespace": NS, "learned_checkpoint_seconds": 0.2, **settings}  # fmt: skip
        app = create_app(ServiceSettings(**merged), gated)
        server = ServerThread(app).start()
        assert kube.wait_synced(15)
        return cls(server, kube, elector, app, app.state.token)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def engine(self):
        return self.app.state.engine  # type: ignore[attr-defined]

    @property
    def checkpoint(self) -> LearnedCheckpoint:
        return self.app.state.checkpoint  # type: ignore[attr-defined]

    def post(self, body: dict) -> httpx.Response:
        auth = {"Authorization": f"Bearer {self.token}"}
        return httpx.post(f"{self.url}/observations", json=body, headers=auth, timeout=30)

    def epoch(self) -> None:
        reply = httpx.post(f"{self.url}/epoch", timeout=30,
                           headers={"Authorization": f"Bearer {self.token}"})  # fmt: skip
        assert reply.status_code == 200, reply.text

    def crash(self) -> None:
        """Die without a last checkpoint and without releasing the Lease (a killed pod)."""
        self.checkpoint.stop(final=False)
        self.elector.stop(release=False)
        self.server.stop()


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    server.put("nodes", gpu_node("g0", 1))
    server.put("nodes", gpu_node("g1", 1))
    server.put("pods", running_pod("a", "g0", 0))
    server.put("pods", running_pod("b", "g0", 0))
    server.put("pods", running_pod("e", "g1", 0))
    yield server
    server.stop()


def stored(api: FakeApiServer) -> dict:
    return api.configmaps[(NS, CM)]


def shares_with_e(replica: Replica) -> bool:
    """Whether the replica's plan puts the pending pod d on e's GPU."""
    replica.epoch()
    plan = replica.engine.published.plan
    a = plan.assignments.get("uid-d")
    return a is not None and ("g1", 0) in a.devices


def test_a_new_leader_restores_what_the_old_one_learned_and_keeps_the_pair_apart(
    api: FakeApiServer, tmp_path: Path
) -> None:
    a = Replica.start(api, "replica-a", tmp_path / "a.db")
    assert wait_for(a.elector.is_leader)
    b = Replica.start(api, "replica-b", tmp_path / "b.db")  # its own, empty SQLite
    try:
        assert wait_for(lambda: len(a.kube.state.pods()) == 3 and len(b.kube.state.pods()) == 3)
        a.epoch()
        b.epoch()
        x = _pair_features(a, "uid-a", "uid-b")  # type: ignore[arg-type]
        base = float(b.engine.predictor.predict(x)[0])
        start = time.time() - 60
        for i in range(8):  # a runs at 1/2.5 of its solo rate next to b
            assert a.post(batch(window("uid-a", SOLO / 2.5, end=start + 5 * i))).status_code == 200
        learned = float(a.engine.predictor.predict(x)[0])
        assert learned == pytest.approx(2.5, rel=0.15) and abs(base - 2.5) > 0.5
        # A follower does not learn: it refuses with 503 naming the leader, changes nothing.
        refused = b.post(batch(window("uid-a", SOLO / 2.5)))
        assert refused.status_code == 503 and "replica-a" in refused.json()["Error"]
        assert refused.headers["Retry-After"]
        assert b.app.state.observations.windows_total == {}  # type: ignore[attr-defined]
        # The leader's periodic checkpoint carries it (A then dies without a last write).
        assert wait_for(lambda: a.checkpoint.writes >= 1 and (NS, CM) in api.configmaps)
        version = a.app.state.observations.learned_version  # type: ignore[attr-defined]
        assert wait_for(lambda: a.checkpoint._written_version == version)
        meta = stored(api)["metadata"]
        assert meta["annotations"]["elastico.io/learned-writer"] == "replica-a"
        a.crash()
        assert wait_for(b.elector.is_leader, timeout=TIMING.lease_duration + 5)
        # B restored the checkpoint before leading: its predictor answers what A learned.
        assert float(b.engine.predictor.predict(x)[0]) == pytest.approx(learned, rel=1e-6)
        # ... and refuses to co-locate that pair: a new bert pod does not join e.
        api.put("pods", pending_pod("d"))
        assert wait_for(lambda: b.kube.state.pod_by_name("ml", "d") is not None)
        assert not shares_with_e(b)
        # B's own file now holds it too: a restart of B alone keeps it.
        reopened = LoopStore(tmp_path / "b.db")
        correction = OnlineCorrection(ContentionPredictor())
        assert reopened.load_correction(correction) > 0
        reopened.close()
        assert float(correction.predict(x)[0]) == pytest.approx(learned, rel=1e-6)
    finally:
        b.server.stop()
        a.server.stop()


def test_without_the_checkpoint_the_same_pod_would_be_co_located(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """The control of the test above: a replica that never saw the observations shares."""
    api.put("pods", pending_pod("d"))
    c = Replica.start(api, "replica-c", tmp_path / "c.db", learned_checkpoint=False)
    try:
        assert wait_for(c.elector.is_leader)
        assert wait_for(lambda: len(c.kube.state.pods()) == 4)
        assert shares_with_e(c)
    finally:
        c.server.stop()


def test_a_full_restart_restores_from_the_api_server_alone(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """Every replica gone, every SQLite file gone: the ConfigMap brings it back."""
    a = Replica.start(api, "replica-a", tmp_path / "a.db")
    try:
        assert wait_for(a.elector.is_leader)
        assert wait_for(lambda: len(a.kube.state.pods()) == 3)
        a.epoch()
        x = _pair_features(a, "uid-a", "uid-b")  # type: ignore[arg-type]
        start = time.time() - 60
        for i in range(6):
            assert a.post(batch(window("uid-a", SOLO / 2.0, end=start + 5 * i))).status_code == 200
        learned = float(a.engine.predictor.predict(x)[0])
    finally:
        a.server.stop()  # a clean stop writes once more, then releases the Lease
    assert stored(api)["metadata"]["annotations"]["elastico.io/learned-writer"] == "replica-a"
    fresh = Replica.start(api, "replica-z", tmp_path / "z.db")
    try:
        assert wait_for(fresh.elector.is_leader)
        assert float(fresh.engine.predictor.predict(x)[0]) == pytest.approx(learned, rel=1e-6)
    finally:
        fresh.server.stop()


# -- followers keep up; what an operator sees of the checkpoint ---------------------------


def metric(url: str, name: str, **labels: str) -> float | None:
    """One sample of the replica's ``/metrics`` (None when the series is absent)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def learn_a_harmful_pair(a: Replica, b: Replica) -> tuple[np.ndarray, float, float]:
    """Both replicas plan; a (the leader) takes 8 windows of uid-a at 1/2.5 of its solo rate
    next to uid-b.  Returns the pair's features, what a learned, and what b's REST view
    predicted for pod a before."""
    assert wait_for(lambda: len(a.kube.state.pods()) == 3 and len(b.kube.state.pods()) == 3)
    a.epoch()
    b.epoch()
    x = _pair_features(a, "uid-a", "uid-b")  # type: ignore[arg-type]
    base = float(b.engine.predictor.predict(x)[0])
    rest_before = predicted_for_a(b)
    start = time.time() - 60
    for i in range(8):
        assert a.post(batch(window("uid-a", SOLO / 2.5, end=start + 5 * i))).status_code == 200
    learned = float(a.engine.predictor.predict(x)[0])
    assert abs(learned - base) > 0.5
    return x, learned, rest_before


def settled(api: FakeApiServer, leader: Replica, follower: Replica) -> bool:
    """The leader wrote all it learned, and the follower holds that very checkpoint (the
    windows all say 2.5: an earlier checkpoint may already predict the same)."""
    learned = leader.app.state.observations.learned_version  # type: ignore[attr-defined]
    newest = stored(api)["metadata"]["resourceVersion"]
    return (
        leader.checkpoint._written_version == learned
        and follower.checkpoint.status()["resource_version"] == newest
    )


def predicted_for_a(replica: Replica) -> float:
    """``GET /jobs`` on the replica: the predicted slowdown of pod a next to b."""
    reply = httpx.get(f"{replica.url}/jobs", timeout=30)
    assert reply.status_code == 200, reply.text
    (row,) = [r for r in reply.json() if r["pod"] == "ml/a"]
    return float(row["predicted_slowdown"])


def test_a_follower_refreshes_from_the_checkpoint_while_following_and_never_writes(
    api: FakeApiServer, tmp_path: Path
) -> None:
    a = Replica.start(api, "replica-a", tmp_path / "a.db")
    assert wait_for(a.elector.is_leader)
    b = Replica.start(api, "replica-b", tmp_path / "b.db")  # its own, empty SQLite
    try:
        x, learned, rest_before = learn_a_harmful_pair(a, b)
        # While following, b takes up what a learned from the ConfigMap alone ...
        assert wait_for(lambda: float(b.engine.predictor.predict(x)[0]) == pytest.approx(learned))
        assert not b.elector.is_leader()
        # ... so its next plan, and its REST views, answer from it (it plans without the
        # leader's observations: only the learned prediction can have moved it)
        b.epoch()
        assert predicted_for_a(b) == pytest.approx(learned, rel=0.1)
        assert rest_before != pytest.approx(learned, rel=0.1)
        # b never wrote: the ConfigMap is a's, and b counts no write
        assert b.checkpoint.writes == 0
        assert stored(api)["metadata"]["annotations"]["elastico.io/learned-writer"] == "replica-a"
        # Nothing new learned: b keeps reading and decodes nothing; a neither writes again
        # nor reads its own checkpoint back (that would change its state and rewrite it)
        assert wait_for(lambda: settled(api, a, b))
        version = stored(api)["metadata"]["resourceVersion"]
        merges, reads, writes = b.checkpoint.merges, b.checkpoint.reads, a.checkpoint.writes
        assert wait_for(lambda: b.checkpoint.reads >= reads + 5)
        assert b.checkpoint.merges == merges
        assert a.checkpoint.writes == writes and a.checkpoint.merges == 0
        assert stored(api)["metadata"]["resourceVersion"] == version
        # A takeover starts from the newest learning, with nothing left to decode
        a.crash()
        assert wait_for(b.elector.is_leader, timeout=TIMING.lease_duration + 5)
        assert float(b.engine.predictor.predict(x)[0]) == pytest.approx(learned)
        assert b.checkpoint.merges == merges
    finally:
        b.server.stop()
        if a.elector.is_leader():  # not crashed: the test failed before the hand-over
            a.server.stop()


def test_checkpoint_age_size_and_failures_on_metrics_and_healthz(
    api: FakeApiServer, tmp_path: Path
) -> None:
    a = Replica.start(api, "replica-a", tmp_path / "a.db")
    assert wait_for(a.elector.is_leader)
    b = Replica.start(api, "replica-b", tmp_path / "b.db")
    try:
        x, learned, _ = learn_a_harmful_pair(a, b)
        assert wait_for(lambda: settled(api, a, b))
        size = len(payload_of(api))
        for replica, role in ((a, "leader"), (b, "follower")):
            health = httpx.get(f"{replica.url}/healthz", timeout=30).json()["learned_checkpoint"]
            assert health["role"] == role and health["configmap"] == f"{NS}/{CM}"
            assert health["bytes"] == size
            assert metric(replica.url, "elastico_learned_checkpoint_bytes") == size
            age = metric(replica.url, "elastico_learned_checkpoint_age_seconds")
            assert age is not None and 0 <= age < 3.0  # synced every 0.2 s
            for reason in FAILURE_REASONS:  # every reason listed, none counted
                assert metric(replica.url, "elastico_learned_checkpoint_failures_total",
                              reason=reason) == 0.0  # fmt: skip
            assert health["failures"] == dict.fromkeys(FAILURE_REASONS, 0)
        # Garbage replaces the checkpoint: the follower counts it once, however often it
        # reads it, keeps what it has, and its age grows while a has nothing new to write
        core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
        core.replace_namespaced_config_map(CM, NS, {"metadata": {"name": CM}, "binaryData": {
            DATA_KEY: base64.b64encode(b"garbage").decode()}})  # fmt: skip
        reads = b.checkpoint.reads
        assert wait_for(lambda: b.checkpoint.reads >= reads + 8)
        unreadable = "elastico_learned_checkpoint_failures_total"
        assert metric(b.url, unreadable, reason="unreadable") == 1.0
        age = metric(b.url, "elastico_learned_checkpoint_age_seconds")
        assert age is not None and age > 1.0
        health = httpx.get(f"{b.url}/healthz", timeout=30).json()["learned_checkpoint"]
        assert health["last_failure"]["reason"] == "unreadable"
        assert float(b.engine.predictor.predict(x)[0]) == pytest.approx(learned)
        # a learns once more: its write meets a version it did not write (a conflict,
        # counted), replaces the garbage, and b is in sync again
        later = time.time() - 10
        assert a.post(batch(window("uid-a", SOLO / 2.5, end=later))).status_code == 200
        assert wait_for(lambda: decode_or_none(payload_of(api)) is not None)
        assert metric(a.url, unreadable, reason="conflict") == 1.0
        assert wait_for(lambda: b.checkpoint.age_seconds() < 1.0)
        assert metric(b.url, unreadable, reason="unreadable") == 1.0
    finally:
        b.server.stop()
        a.server.stop()


def decode_or_none(payload: bytes) -> LearnedState | None:
    try:
        return decode(payload)
    except CorruptSnapshot:
        return None


# -- the writer's side, against the fake API server ---------------------------------------


def observation_service(seed: int, rows: int = 4) -> ObservationService:
    svc = ObservationService(ServiceSettings(), loop=ClosedLoop(OnlineCorrection(
        ContentionPredictor())))  # fmt: skip
    teach(svc, seed, rows)
    return svc


def teach(svc: ObservationService, seed: int, rows: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.random((rows, NUM_FEATURES), dtype=np.float32)
    assert svc.loop.correction is not None
    svc.loop.correction.learn(x, np.full(rows, 3.0))
    svc.learned_version += 1
    return x


def keys(payload: bytes) -> set[int]:
    return {k for k, _, _ in decode(payload).config}


def payload_of(api: FakeApiServer) -> bytes:
    return base64.b64decode(stored(api)["binaryData"][DATA_KEY])


def writer(api: FakeApiServer, svc: ObservationService, term: int, **kw) -> LearnedCheckpoint:
    conf = client.ApiClient(client.Configuration(host=api.url))
    return LearnedCheckpoint(conf, svc, namespace=NS, term=lambda: term,
                             identity=f"term-{term}", **kw)  # fmt: skip


def test_a_deposed_leaders_write_is_refused_and_does_not_clobber_the_newer_one(
    api: FakeApiServer,
) -> None:
    old, new = observation_service(1), observation_service(2)
    a, b = writer(api, old, 1), writer(api, new, 2)
    assert not a.restore() and a.save() == "written"
    assert b.restore()  # B became leader: it merged A's checkpoint ...
    assert b.save() == "written"  # ... and wrote under its newer term
    newer = payload_of(api)
    version = stored(api)["metadata"]["resourceVersion"]
    teach(old, 3, 4)  # the deposed A learned more and tries to write
    assert a.save() == "deposed"
    assert payload_of(api) == newer and stored(api)["metadata"]["resourceVersion"] == version
    assert a.save() == "deposed"  # and keeps away while its term is older
    # The API server itself refuses a write conditional on a stale resourceVersion.
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
    body = {"metadata": {"name": CM, "resourceVersion": str(int(version) - 1)},
            "data": {"x": "y"}}  # fmt: skip
    with pytest.raises(ApiException) as refused:
        core.replace_namespaced_config_map(CM, NS, body)
    assert refused.value.status == 409
    assert payload_of(api) == newer


def test_an_old_leaders_late_write_is_merged_not_lost(api: FakeApiServer) -> None:
    """The old leader's last write lands after the new one read the checkpoint: the new
    leader's next write gets 409, reads it, merges it and writes both."""
    old, new = observation_service(1), observation_service(2)
    a, b = writer(api, old, 1), writer(api, new, 2)
    assert a.save() == "written"
    assert b.restore()
    late = teach(old, 3, 3)
    assert a.save() == "written"  # in flight when B took over: B has not written yet
    teach(new, 4, 2)
    assert b.save() == "written"
    merged = keys(payload_of(api))
    late_keys = {k for k, _, _ in old.learned_state(0).config[-3:]}
    assert late_keys <= merged
    assert {k for k, _, _ in new.learned_state(0).config} <= merged
    assert late.shape == (3, NUM_FEATURES)
    teach(old, 5, 1)
    assert a.save() == "deposed"


def test_an_oversized_state_is_trimmed_to_the_bound_keeping_the_newest_rows(
    api: FakeApiServer,
) -> None:
    svc = observation_service(5, rows=0)
    correction = svc.loop.correction
    assert correction is not None
    rng = np.random.default_rng(7)
    config = [
        (int(k), float(m), 3.0)
        for k, m in zip(
            rng.integers(1, 2**63, 150_000).tolist(), rng.normal(size=150_000).tolist(), strict=True
        )
    ]
    correction.restore_rows("config", config)
    correction.restore_neighbours(
        (i, rng.random(NUM_FEATURES, dtype=np.float32), 0.5, 2.0) for i in range(2048)
    )
    svc.learned_version += 1
    bound = 64 << 10
    w = writer(api, svc, 0, max_bytes=bound)
    assert w.save() == "written"
    cm = stored(api)
    assert len(payload_of(api)) <= bound
    assert len(json.dumps(cm)) < 1 << 20
    dropped = json.loads(cm["metadata"]["annotations"]["elastico.io/learned-dropped"])
    kept = json.loads(cm["metadata"]["annotations"]["elastico.io/learned-kept"])
    assert dropped["config"] > 0 and kept["config"] + dropped["config"] == 150_000
    assert kept["config"] > 1000
    state = decode(payload_of(api))
    assert [k for k, _, _ in state.config] == [k for k, _, _ in config[-kept["config"] :]]
    # the default bound holds the whole correction of a large cluster in one object
    assert w.max_bytes < 1 << 20
    default = writer(api, svc, 0)
    payload, _, _ = encode(svc.learned_state(0), default.max_bytes)
    assert len(base64.b64encode(payload)) < 1 << 20


def test_a_garbage_checkpoint_is_ignored_with_a_warning_and_then_replaced(
    api: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    svc = observation_service(1)
    w = writer(api, svc, 0)
    good, _, _ = encode(svc.learned_state(0), 1 << 20)
    raw = zlib.decompress(good)
    header = json.loads(raw.partition(b"\n")[0])
    header["arrays"]["config.key"]["shape"] = [10**12]
    huge = zlib.compress(json.dumps(header).encode() + b"\n" + raw.partition(b"\n")[2])
    variants: list[dict] = [
        {"binaryData": {DATA_KEY: base64.b64encode(b"not a snapshot").decode()}},
        {"binaryData": {DATA_KEY: "%%% not base64 %%%"}},
        {"binaryData": {DATA_KEY: base64.b64encode(good[: len(good) // 2]).decode()}},
        {"binaryData": {DATA_KEY: base64.b64encode(zlib.compress(b'{"format": 3}\n')).decode()}},
        {"binaryData": {DATA_KEY: base64.b64encode(huge).decode()}},
        {"binaryData": {DATA_KEY: base64.b64encode(zlib.compress(b"\0" * (80 << 20))).decode()}},
        {"data": {"something": "else"}},
    ]
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
    before = svc.learned_state(0).config
    for i, extra in enumerate(variants):
        body = {"metadata": {"name": CM}, **extra}
        if i == 0:
            core.create_namespaced_config_map(NS, body)
        else:
            core.replace_namespaced_config_map(CM, NS, body)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="elastico_extender.service.checkpoint"):
            assert w.restore() is False, extra
        assert any("checkpoint.unreadable" in r.getMessage() for r in caplog.records), extra
        assert svc.learned_state(0).config == before
    # the replica's next write replaces the garbage (the stored object has no newer term)
    assert w.save() == "written"
    assert keys(payload_of(api)) == {k for k, _, _ in before}


def test_a_service_starts_and_learns_over_a_garbage_checkpoint(
    api: FakeApiServer, tmp_path: Path
) -> None:
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
    core.create_namespaced_config_map(NS, {"metadata": {"name": CM}, "binaryData": {
        DATA_KEY: base64.b64encode(b"\x78\x9c garbage").decode()}})  # fmt: skip
    a = Replica.start(api, "replica-a", tmp_path / "a.db")
    try:
        assert wait_for(a.elector.is_leader)
        assert wait_for(lambda: len(a.kube.state.pods()) == 3)
        a.epoch()
        assert a.post(batch(window("uid-a", SOLO / 2.0))).status_code == 200
        # the garbage stays until the leader's first write (decode raises on it till then)
        assert wait_for(lambda: bool((decode_or_none(payload_of(api)) or LearnedState()).config))
        assert decode(payload_of(api)).references
    finally:
        a.server.stop()


@pytest.mark.parametrize("cut", [0, 1, 7, 40, 200])
def test_decode_refuses_truncated_or_altered_payloads(cut: int) -> None:
    svc = observation_service(9)
    payload, _, _ = encode(svc.learned_state(0), 1 << 20)
    with pytest.raises(CorruptSnapshot):
        decode(payload[:cut])
    raw = bytearray(zlib.decompress(payload))
    raw[len(raw) - 1 - cut % 16 :] = b""  # arrays shorter than the header says
    with pytest.raises(CorruptSnapshot):
        decode(zlib.compress(bytes(raw)))


def test_merging_the_same_history_twice_adds_nothing(tmp_path: Path) -> None:
    store = LoopStore(tmp_path / "s.db")
    x = np.ones((3, NUM_FEATURES), dtype=np.float32)
    samples = (x, np.array([1.5, 2.0, 3.0]), np.array([10.0, 11.0, 12.0]))
    records = [PairRecord("a", 0, "b", 2.0, 1.2, 11.0)]
    assert store.merge_history(samples, records) == (3, 1)
    assert store.merge_history(samples, records) == (0, 0)
    got = store.recent_samples(10)
    assert got[1].tolist() == [1.5, 2.0, 3.0] and got[2].tolist() == [10.0, 11.0, 12.0]
    state = LearnedState(samples=samples, records=records)
    back = decode(encode(state, 1 << 20)[0])
    assert back.records == records and back.samples[1].tolist() == [1.5, 2.0, 3.0]
    store.close()


def test_the_bound_drops_history_then_references_then_the_correction() -> None:
    rng = np.random.default_rng(3)
    config = [(int(k), 0.3, 2.0) for k in rng.integers(1, 2**63, 2000).tolist()]
    refs = [(f"pod-{i}", 0, "launches/s", 100.0 + i, True) for i in range(2000)]
    x = rng.random((2000, NUM_FEATURES), dtype=np.float32)
    samples = (x, np.full(2000, 1.5), np.arange(2000.0))
    alone, _, _ = encode(LearnedState(config=config), 1 << 20)
    bound = len(alone) + 2048
    full = LearnedState(config=config, references=refs, samples=samples)
    payload, kept, dropped = encode(full, bound)
    assert len(payload) <= bound
    assert kept["samples"] == 0 and dropped["samples"] == 2000
    assert 0 < dropped["references"] < 2000 and kept["config"] == 2000
    back = decode(payload)
    assert [r[0] for r in back.references] == [r[0] for r in refs[-kept["references"] :]]
    tight, kept, _ = encode(full, len(alone) // 2)
    assert kept["references"] == 0 and 0 < kept["config"] < 2000
    assert [k for k, _, _ in decode(tight).config] == [k for k, _, _ in config[-kept["config"] :]]


def test_rows_the_reader_would_refuse_are_dropped_by_the_writer_not_the_whole_checkpoint() -> None:
    """A row the leader holds that the decoder refuses (a reference's configuration of
    2**40 or a 300-character job read from a hand-edited store, a per-pod record's NaN):
    before, it was written as is, and the next leader refused the whole checkpoint
    ("references.config: not a count"), losing every learned row with it.  Now the writer
    drops such rows and counts them as dropped."""
    from elastico_extender.core.duration import CompletedJob

    good_ref = ("pod-a", 3, "launches/s", 120.0, True)
    good_record = PairRecord("pod-a", 3, "pod-b", 1.4, 1.3, 10.0)
    good_done = ("uid-1", CompletedJob("bert", 1, 300.0, "team"), 20.0)
    state = LearnedState(
        config=[(7, 0.4, 2.0)],
        references=[("pod-x", 2**40, "launches/s", 5.0, True), ("j" * 300, 1, "u", 5.0, False),
                    good_ref],
        records=[PairRecord("pod-x", 1, "pod-y", float("nan"), None, 10.0), good_record],
        completions=[("uid-0", CompletedJob("bert", -1, 300.0, "team"), 20.0), good_done],
    )  # fmt: skip
    payload, kept, dropped = encode(state, 1 << 20)
    back = decode(payload)
    assert back.config == [(7, pytest.approx(0.4), 2.0)]
    assert back.references == [good_ref]
    assert back.records == [good_record]
    assert back.completions == [good_done]
    assert dropped["references"] == 2 and dropped["records"] == 1 and dropped["completions"] == 1
    assert kept["references"] == 1


def test_a_checkpoint_of_an_earlier_lease_does_not_depose_the_new_leader(
    api: FakeApiServer,
) -> None:
    """The Lease was deleted and created anew (transitions from 0): the leader writes above
    the term it restored, and a writer that did not restore is the one refused."""
    before = observation_service(1)
    assert writer(api, before, 9).save() == "written"
    svc = observation_service(2)
    fresh = writer(api, svc, 0)
    assert fresh.restore()
    teach(svc, 3, 2)
    assert fresh.save() == "written"
    assert stored(api)["metadata"]["annotations"]["elastico.io/learned-term"] == "10"
    teach(svc, 4, 1)
    assert fresh.save() == "written"
    teach(before, 5, 1)
    assert writer(api, before, 9).save() == "deposed"


class Forbidding:
    """An API server on 127.0.0.1 without the RBAC grant: 403 Forbidden to everything."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                   "reason": "Forbidden", "code": 403,
                                   "message": "configmaps is forbidden"}).encode()  # fmt: skip
                self.send_response(403)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_failures_are_counted_by_reason_once_each(api: FakeApiServer) -> None:
    none = dict.fromkeys(FAILURE_REASONS, 0)
    svc = observation_service(1)
    forbidden = Forbidding()
    try:  # the API server answers, but refuses (RBAC): api_error, read and write
        w = LearnedCheckpoint(client.ApiClient(client.Configuration(host=forbidden.url)), svc,
                              namespace=NS)  # fmt: skip
        assert w.restore() is False and w.save() == "failed"
        assert w.failures == {**none, "api_error": 2}
        status = w.status()
        assert status["last_failure"]["reason"] == "api_error" and not status["synced"]
        assert status["last_failure"]["operation"] == "write"
    finally:
        forbidden.stop()
    # nothing answers at all
    gone = LearnedCheckpoint(client.ApiClient(client.Configuration(host="http://127.0.0.1:9")),
                             svc, namespace=NS)  # fmt: skip
    assert gone.save() == "failed" and gone.failures == {**none, "unreachable": 1}
    # a deposed leader: its conflict and the newer term counted once, however often it tries
    old, new = observation_service(2), observation_service(3)
    a, b = writer(api, old, 1), writer(api, new, 2)
    assert a.save() == "written" and b.restore() and b.save() == "written"
    for _ in range(3):
        teach(old, 4, 1)
        assert a.save() == "deposed"
    assert a.failures == {**none, "conflict": 1, "deposed": 1}
    assert b.failures == none and b.status()["synced"]
    assert b.status()["bytes"] == len(payload_of(api))


def test_a_newer_versions_checkpoint_is_kept_not_overwritten(api: FakeApiServer) -> None:
    """After a rollback, an older replica finds a checkpoint of a newer format: it cannot
    read it, and must not write over it either (the newer version's learning would be lost
    for good when the upgrade is applied again); a readable checkpoint lifts the hold."""
    svc = observation_service(1)
    w = writer(api, svc, 0)
    good, _, _ = encode(svc.learned_state(0), 1 << 20)
    raw = zlib.decompress(good)
    header = json.loads(raw.partition(b"\n")[0])
    header["format"] = "elastico-learned/2"
    newer = zlib.compress(json.dumps(header).encode() + b"\n" + raw.partition(b"\n")[2])
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
    body = {"metadata": {"name": CM}, "binaryData": {DATA_KEY: base64.b64encode(newer).decode()}}
    core.create_namespaced_config_map(NS, body)
    assert w.restore() is False
    assert w.save() == "newer" and w.save(force=True) == "newer"
    assert base64.b64decode(stored(api)["binaryData"][DATA_KEY]) == newer  # untouched
    assert w.status()["last_failure"]["reason"] == "newer_format"
    # the operator deletes it (or the newer version writes a readable one): writes resume
    core.delete_namespaced_config_map(CM, NS)
    assert w.restore() is False  # nothing stored
    assert w.save() == "written"


@pytest.mark.parametrize(
    "rows",
    [
        {"references": [("pod-x", 10**20, "launches/s", 100.0, True)]},
        {"records": [PairRecord("pod-x", 10**20, "pod-y", 2.0, None, 5.0)]},
        {"references": [("pod-x", -3, "launches/s", 100.0, True)]},
    ],
    ids=["huge-reference-config", "huge-record-config", "negative-reference-config"],
)
def test_a_service_starts_over_a_checkpoint_naming_an_impossible_configuration(
    api: FakeApiServer, tmp_path: Path, rows: dict
) -> None:
    """A well-formed checkpoint (an edited ConfigMap) whose rows name a configuration index
    no family has, beyond SQLite's 64-bit integers included, is unreadable: the replica
    starts and learns, as over any other garbage, and nothing of it reaches the book."""
    from elastico_extender.profiles.loop_snapshot import _pack

    payload = _pack(LearnedState(**rows), {})  # unchecked, as a hostile or older writer's
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
    core.create_namespaced_config_map(NS, {"metadata": {"name": CM}, "binaryData": {
        DATA_KEY: base64.b64encode(payload).decode()}})  # fmt: skip
    a = Replica.start(api, "replica-a", tmp_path / "a.db")
    try:
        assert wait_for(a.elector.is_leader)
        assert a.checkpoint.status()["failures"]["unreadable"] == 1
        assert not a.app.state.observations.book.state()["refs"]  # type: ignore[attr-defined]
        assert wait_for(lambda: len(a.kube.state.pods()) == 3)
        a.epoch()
        assert a.post(batch(window("uid-a", SOLO / 2.0))).status_code == 200
    finally:
        a.server.stop()


def test_a_restore_that_fails_unexpectedly_never_stops_the_service_starting(
    api: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start-up restore runs before the service answers; an error no decoder check
    foresaw (a checkpoint written by a newer release, a bug) must leave the replica
    starting without what it would have learned, as the takeover's restore already does,
    not crash-loop the extender until someone deletes the ConfigMap."""
    payload, _, _ = encode(
        LearnedState(references=[("pod-x", 1, "launches/s", 1.0, True)]), 1 << 20
    )
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
    core.create_namespaced_config_map(NS, {"metadata": {"name": CM}, "binaryData": {
        DATA_KEY: base64.b64encode(payload).decode()}})  # fmt: skip

    def broken(self, obj, rv, event):  # an unforeseen failure while merging
        raise RuntimeError("merge failed")

    monkeypatch.setattr(LearnedCheckpoint, "_take", broken)
    a = Replica.start(api, "replica-a", tmp_path / "a.db")
    try:
        assert httpx.get(f"{a.url}/healthz", timeout=10).status_code == 200
        assert wait_for(a.elector.is_leader)
    finally:
        a.server.stop()
