"""Closed loop, service side: node agents' windows over real HTTP into the next snapshot.

The extender runs under uvicorn on 127.0.0.1 with the real kubernetes client against the
project's fake API server (real Pod JSON, list/watch); observations are posted the way
``elastico agent`` posts them.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from kubernetes import client

from elastico_extender.api.app import create_app
from elastico_extender.cluster.fake_apiserver import FakeApiServer
from elastico_extender.cluster.kube import KubeCluster
from elastico_extender.core.interference.features import pair_features
from elastico_extender.core.shapes.catalog import catalog_families
from elastico_extender.service.pods import DECISION_VOLUME
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings

BERT = catalog_families()["bert"]
FASTEST = BERT.configs[BERT.fastest_index].label
SOLO = float(BERT.throughput[BERT.fastest_index])  # samples/s: the profile's T(c)


def gpu_node(name: str, gpus: int, memory_mib: int = 81920) -> dict:
    labels = {"nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.memory": str(memory_mib),
              "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}  # fmt: skip
    alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus), "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {}, "status": {"allocatable": alloc, "capacity": alloc}}  # fmt: skip


def running_pod(name: str, node: str, device: int, *, family: str = "bert", **extra: str) -> dict:
    """A pod the extender bound earlier: its decision annotations say where it runs."""
    annotations = {
        "elastico.io/family": family,
        "elastico.io/assigned-node": node,
        "elastico.io/assigned-devices": str(device),
        "elastico.io/assigned-configuration": FASTEST,
        **{f"elastico.io/{k}": v for k, v in extra.items()},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                     "annotations": annotations,
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                          "uid": f"owner-{name}", "controller": True}]},
        "spec": {"schedulerName": "elastico-scheduler", "nodeName": node,
                 "containers": [{"name": "main", "image": "img",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                 # admitted through the webhook, as its downward-API volume shows
                 "volumes": [{"name": DECISION_VOLUME, "downwardAPI": {"items": []}}]},
        "status": {"phase": "Running"},
    }  # fmt: skip


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@dataclass
class Service:
    api: FakeApiServer
    url: str
    token: str
    app: object

    def post(self, body: object, token: str | None = "default") -> httpx.Response:
        token = self.token if token == "default" else token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(f"{self.url}/observations", content=data, headers=headers, timeout=30)

    def epoch(self) -> dict:
        reply = httpx.post(
            f"{self.url}/epoch", headers={"Authorization": f"Bearer {self.token}"}, timeout=30
        )
        assert reply.status_code == 200, reply.text
        return reply.json()

    @property
    def engine(self):
        return self.app.state.engine  # type: ignore[attr-defined]

    def observed(self) -> dict:
        return dict(self.engine.published.snapshot.observed)


def start_service(api: FakeApiServer, **settings) -> tuple[ServerThread, KubeCluster, Service]:
    kube = KubeCluster(
        client.ApiClient(client.Configuration(host=api.url)),
        resync_seconds=300,
        watch_timeout_seconds=30,
    )
    app = create_app(ServiceSettings(epoch_seconds=3600, **settings), kube)
    server = ServerThread(app).start()
    assert kube.wait_synced(15)
    return server, kube, Service(api, server.url, app.state.token, app)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 2))
    api.put("pods", running_pod("a", "g0", 0))
    api.put("pods", running_pod("b", "g0", 0))
    api.put("pods", running_pod("c", "g0", 1))
    server, kube, svc = start_service(
        api, observation_store=str(tmp_path / "loop.db"), observation_stale_seconds=0.5
    )
    assert wait_for(lambda: len(kube.state.pods()) == 3)
    svc.epoch()
    yield svc
    server.stop()
    api.stop()


def two_gpu_pod(name: str, node: str) -> dict:
    """A running pod the extender bound to GPUs 0 and 1 of ``node`` (a two-worker gang)."""
    pod = running_pod(name, node, 0)
    pod["metadata"]["annotations"]["elastico.io/assigned-devices"] = "0,1"
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    return pod


def window(uid: str, rate: float, end: float | None = None, **extra: object) -> dict:
    item = {"pod_uid": uid, "end": time.time() if end is None else end, "seconds": 5.0,
            "rate": rate, "unit": "samples/s"}  # fmt: skip
    item.update(extra)
    return item


def batch(*items: dict, node: str = "g0") -> dict:
    return {"node": node, "observations": list(items)}


def test_posted_windows_land_in_the_next_snapshot(service: Service) -> None:
    reply = service.post(batch(window("uid-a", SOLO / 2), window("uid-c", SOLO)))
    assert reply.status_code == 200, reply.text
    assert reply.json()["accepted"] == 2
    assert service.observed() == {}  # the published snapshot predates the windows
    service.epoch()
    observed = service.observed()
    assert set(observed) == {"uid-a", "uid-c"}
    # the profile's T(c) is a's solo rate (same unit); b shares its GPU, c runs alone
    assert observed["uid-a"].slowdown == pytest.approx(2.0)
    assert observed["uid-a"].partners == ("uid-b",)
    assert observed["uid-c"].slowdown == pytest.approx(1.0)
    assert observed["uid-c"].partners == ()
    snap = service.engine.published.snapshot
    assert snap.now == pytest.approx(time.time(), abs=30)
    assert observed["uid-a"].age(snap.now) < 30


def test_rest_and_metrics_show_observed_against_predicted(service: Service) -> None:
    assert service.post(batch(window("uid-a", SOLO / 1.5))).status_code == 200
    view = httpx.get(f"{service.url}/observations").json()
    pair = next(p for p in view["pairs"] if p["victim"] == "ml/a")
    assert pair["partner"] == "ml/b"
    assert pair["observed_slowdown"] == pytest.approx(1.5)
    assert pair["predicted_slowdown"] is not None
    assert pair["error"] == pytest.approx(pair["predicted_slowdown"] - 1.5)
    assert view["prediction_error"]["windows"] == 1
    (sample,) = service.app.state.observations.store.pair_records()  # type: ignore[attr-defined]
    assert (sample.victim, sample.partner) == ("uid-a", "uid-b")  # labelled, in SQLite
    assert sample.slowdown == pytest.approx(1.5)
    assert sample.predicted == pytest.approx(pair["predicted_slowdown"])
    pod = next(p for p in view["pods"] if p["pod"] == "ml/a")
    assert pod["partners"] == ["ml/b"] and pod["window_slowdown"] == pytest.approx(1.5)
    assert {r["pod"] for r in view["unreported"]} == {"ml/b", "ml/c"}
    metrics = httpx.get(f"{service.url}/metrics").text
    # labelled like the REST view and the per-pod series: namespace/name, not the uid
    assert 'elastico_observed_slowdown{partner="ml/b",victim="ml/a"} 1.5' in metrics
    assert 'elastico_predicted_slowdown{partner="ml/b",victim="ml/a"}' in metrics
    assert 'elastico_observation_age_seconds{pod="ml/a"}' in metrics
    assert "elastico_prediction_error_ratio_count 1.0" in metrics
    assert 'elastico_observation_windows_total{result="accepted"} 1.0' in metrics


def test_a_mixed_window_counts_as_a_slowdown_and_teaches_nothing(service: Service) -> None:
    """The agent marks a window ``mixed`` when a co-tenant of the pod came, went or
    restarted in it.  a's (shared with b) is its slowdown, but labels no pair: no
    pairs row, no sample in SQLite.  c's (alone in the plan) moves no solo reference."""
    now = time.time()
    reply = service.post(
        batch(window("uid-a", SOLO / 1.5, end=now, mixed=True),
              window("uid-c", SOLO / 2, end=now, mixed=True))
    )  # fmt: skip
    assert reply.status_code == 200, reply.text
    book = service.app.state.observations.book  # type: ignore[attr-defined]
    assert book.observed()["uid-a"].slowdown == pytest.approx(1.5)
    assert book.observed()["uid-c"].slowdown == pytest.approx(2.0)  # against the profile
    assert not [r for r in book.state()["refs"] if r[0] == "uid-c" and r[4]]  # none measured
    view = httpx.get(f"{service.url}/observations").json()
    assert view["pairs"] == []
    assert service.app.state.observations.store.pair_records() == []  # type: ignore[attr-defined]
    pod = next(p for p in view["pods"] if p["pod"] == "ml/a")
    assert pod["window_mixed"] is True and pod["window_slowdown"] == pytest.approx(1.5)
    # the next window, one run all through, teaches as before
    assert service.post(batch(window("uid-a", SOLO / 1.5, end=now + 1))).status_code == 200
    view = httpx.get(f"{service.url}/observations").json()
    assert [p["partner"] for p in view["pairs"]] == ["ml/b"]


def _state(service: Service) -> tuple:
    """Everything a refused batch must leave alone (ages and staleness move on by themselves)."""
    view = httpx.get(f"{service.url}/observations").json()
    for row in view["pods"] + view["pairs"]:
        row.pop("age_seconds")
        row.pop("stale", None)
    return (
        json.dumps(view["pods"], sort_keys=True),
        json.dumps(view["pairs"], sort_keys=True),
        view["windows_total"].get("accepted"),
        view["prediction_error"]["windows"],
        service.app.state.observations.book.state(),  # type: ignore[attr-defined]
    )


BAD = [
    ("not json", b"{nope", 400, "malformed JSON"),
    ("empty", b"", 400, "empty"),
    ("not an object", [1, 2], 400, "ObservationBatch"),
    ("no node", {"observations": []}, 400, "node"),
    ("unknown field", batch(window("uid-a", 1.0, extra_field=1)), 400, "extra_field"),
    ("rate as text", batch(window("uid-a", "fast")), 400, "rate"),  # type: ignore[arg-type]
    ("negative rate", batch(window("uid-a", -1.0)), 400, "rate"),
    ("absurd rate", batch(window("uid-a", 1e300)), 400, "rate"),
    ("zero seconds", batch(window("uid-a", 1.0, seconds=0)), 400, "seconds"),
    ("sm above 1", batch(window("uid-a", 1.0, sm_activity=1.5)), 400, "sm_activity"),
    ("negative memory", batch(window("uid-a", 1.0, peak_mem_mib=-5)), 400, "peak_mem_mib"),
    ("odd unit", batch(window("uid-a", 1.0, unit="launches")), 400, "unit"),
    ("mixed as text", batch(window("uid-a", 1.0, mixed="yes")), 400, "mixed"),
    ("unknown pod", batch(window("uid-zz", 1.0)), 422, "pod_uid"),
    ("stale", batch(window("uid-a", 1.0, end=time.time() - 3600)), 422, "stale"),
    ("future", batch(window("uid-a", 1.0, end=time.time() + 3600)), 422, "future"),
    ("twice", batch(window("uid-a", 1.0), window("uid-a", 1.0)), 422, "twice"),
    ("wrong configuration", batch(window("uid-a", 1.0, configuration="x")), 422, "configuration"),
    ("one bad item spoils the batch", batch(window("uid-c", 9.0), window("uid-q", 1.0)), 422,
     "observations[1].pod_uid"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "body", "status", "fragment"), BAD, ids=[b[0] for b in BAD])
def test_bad_batches_get_a_4xx_naming_the_field_and_change_nothing(
    service: Service, case: str, body: object, status: int, fragment: str
) -> None:
    assert service.post(batch(window("uid-c", SOLO))).status_code == 200
    before = _state(service)
    reply = service.post(body)
    assert reply.status_code == status, reply.text
    assert fragment in reply.json()["Error"]
    assert _state(service) == before
    service.epoch()
    assert set(service.observed()) == {"uid-c"}


def test_nan_and_infinity_never_get_in(service: Service) -> None:
    for raw in (b'{"node": "g0", "observations": [{"pod_uid": "uid-a", "end": 1e9, '
                b'"seconds": 5, "rate": NaN, "unit": "samples/s"}]}',
                b'{"node": "g0", "observations": [{"pod_uid": "uid-a", "end": 1e9, '
                b'"seconds": 5, "rate": 1e999, "unit": "samples/s"}]}'):  # fmt: skip
        reply = service.post(raw)
        assert reply.status_code == 400, reply.text
        assert "JSON" in reply.json()["Error"] or "rate" in reply.json()["Error"]
    assert service.app.state.observations.book.observed() == {}  # type: ignore[attr-defined]


def test_unauthenticated_or_oversized_posts_are_refused(service: Service) -> None:
    body = batch(window("uid-a", 1.0))
    for token in (None, "wrong"):
        reply = service.post(body, token=token)
        assert reply.status_code == 401 and "Bearer" in reply.json()["Error"]
    huge = batch(*[window(f"uid-{i}", 1.0) for i in range(20000)])
    reply = service.post(huge)
    assert reply.status_code == 413
    assert service.app.state.observations.book.observed() == {}  # type: ignore[attr-defined]


def test_out_of_order_windows_are_refused(service: Service) -> None:
    now = time.time()
    assert service.post(batch(window("uid-a", 10.0, end=now))).status_code == 200
    reply = service.post(batch(window("uid-a", 10.0, end=now - 1)))
    assert reply.status_code == 422 and "out of order" in reply.json()["Error"]


def test_a_window_resent_by_an_agent_whose_clock_is_ahead_is_refused(service: Service) -> None:
    """The book keeps a window's end clamped to its arrival; the repeat check compared the
    agent's own end with that, so a window from up to 30 s ahead was taken every time it
    was sent, and two copies are the k = 2 windows a separation asks for."""
    ahead = window("uid-a", SOLO / 2, end=time.time() + 20.0)
    assert service.post(batch(ahead)).status_code == 200
    for _ in range(2):
        reply = service.post(batch(ahead))
        assert reply.status_code == 422 and "out of order or repeated" in reply.json()["Error"]
    assert service.app.state.observations._reports["uid-a"].end <= time.time()  # type: ignore[attr-defined]


def test_an_agent_that_stops_reporting_leaves_decisions_and_shows_staleness(
    service: Service,
) -> None:
    assert (
        service.post(batch(window("uid-a", SOLO / 1.2), window("uid-c", SOLO))).status_code == 200
    )
    first = service.epoch()
    time.sleep(0.7)  # observation_stale_seconds is 0.5
    second = service.epoch()
    assert {k: v["devices"] for k, v in second["assignments"].items()} == {
        k: v["devices"] for k, v in first["assignments"].items()
    }
    assert all(a["action"] == "keep" for a in second["assignments"].values())
    observed = service.observed()
    assert observed["uid-a"].slowdown == pytest.approx(1.2)  # the last observation stays
    assert observed["uid-a"].age(service.engine.published.snapshot.now) > 0.5
    view = httpx.get(f"{service.url}/observations").json()
    assert {r["pod"] for r in view["stale"]} == {"ml/a", "ml/c"}
    assert view["agents"]["g0"]["last_report_age_seconds"] > 0.5
    metrics = httpx.get(f"{service.url}/metrics").text
    assert 'elastico_observation_stale{pod="ml/a"} 1.0' in metrics


def test_a_pod_that_left_leaves_the_snapshot_but_not_its_reference(service: Service) -> None:
    assert service.post(batch(window("uid-c", SOLO))).status_code == 200
    service.epoch()
    assert "uid-c" in service.observed()
    service.api.delete("pods", "ml/c")
    assert wait_for(lambda: service.engine.cluster.state.pod_by_name("ml", "c") is None)
    service.epoch()  # the plan without c is published ...
    service.epoch()  # ... and seen when the next snapshot is built
    assert "uid-c" not in service.observed()
    view = httpx.get(f"{service.url}/observations").json()
    assert all(p["id"] != "uid-c" for p in view["pods"])
    book = service.app.state.observations.book  # type: ignore[attr-defined]
    assert book.reference("uid-c", BERT.fastest_index, "samples/s") == pytest.approx(SOLO)


def test_a_pair_whose_pod_left_leaves_the_view(service: Service) -> None:
    """The pairs of /observations name pods as namespace/name; a pair one of whose pods
    left is forgotten with that pod (its samples stay in the store), rather than listed
    under the bare uid until 20,000 newer pairs push it out."""
    assert service.post(batch(window("uid-a", SOLO / 2), window("uid-b", SOLO / 2))).json() == {
        "accepted": 2,
        "pair_samples": 2,
    }
    view = httpx.get(f"{service.url}/observations").json()
    assert {(p["victim"], p["partner"]) for p in view["pairs"]} == {
        ("ml/a", "ml/b"),
        ("ml/b", "ml/a"),
    }
    service.api.delete("pods", "ml/a")
    assert wait_for(lambda: service.engine.cluster.state.pod_by_name("ml", "a") is None)
    service.epoch()  # the plan without a is published ...
    service.epoch()  # ... and seen when the next snapshot is built
    view = httpx.get(f"{service.url}/observations").json()
    assert view["pairs"] == []
    assert len(service.app.state.observations.store.pair_records()) == 2  # type: ignore[attr-defined]


def test_harmful_pairs_metric_counts_colocated_pairs_observed_above_tolerance(
    service: Service,
) -> None:
    """elastico_harmful_pairs_observed (the chart's alert and dashboard panel) counts the
    running, co-located pairs where a pod's observed slowdown next to the other exceeds
    its tolerance; it drops when the pair ends."""

    def harmful() -> float:
        metrics = httpx.get(f"{service.url}/metrics").text
        (line,) = [x for x in metrics.splitlines() if x.startswith("elastico_harmful_pairs")]
        return float(line.split()[-1])

    assert harmful() == 0.0
    (a,) = [j for j in httpx.get(f"{service.url}/jobs").json() if j["pod"] == "ml/a"]
    assert 1.1 < a["tolerance"] < 2.0
    items = (window("uid-a", SOLO / 2.0), window("uid-b", SOLO / 1.1))
    assert service.post(batch(*items)).status_code == 200
    assert harmful() == 1.0  # a suffers next to b (b next to a is within its tolerance)
    for _ in range(20):  # smoothed: enough mild windows bring a below its tolerance
        time.sleep(0.002)
        items = (window("uid-a", SOLO / 1.1), window("uid-b", SOLO / 1.1))
        assert service.post(batch(*items)).status_code == 200
    assert harmful() == 0.0
    items = (window("uid-a", SOLO / 3.0), window("uid-b", SOLO / 3.0))
    assert service.post(batch(*items)).status_code == 200
    assert harmful() == 1.0  # one pair, however many of its pods suffer
    service.api.delete("pods", "ml/b")
    assert wait_for(lambda: service.engine.cluster.state.pod_by_name("ml", "b") is None)
    service.epoch()
    assert harmful() == 0.0


def test_every_rest_view_records_its_latency(service: Service) -> None:
    """elastico_extender_request_seconds covers the REST views (docs/monitoring.md)."""
    for path in ("/prices", "/jobs", "/nodes", "/plan", "/observations"):
        assert httpx.get(f"{service.url}{path}").status_code == 200
    metrics = httpx.get(f"{service.url}/metrics").text
    for verb in ("prices", "jobs", "nodes", "plan", "observations"):
        assert f'elastico_extender_request_seconds_count{{verb="{verb}"}} 1.0' in metrics, verb


def test_a_failing_store_degrades_to_memory_not_to_a_5xx(service: Service) -> None:
    service.app.state.observations.store.close()  # type: ignore[attr-defined]
    reply = service.post(batch(window("uid-c", SOLO)))
    assert reply.status_code == 200 and reply.json()["accepted"] == 1
    service.epoch()
    assert "uid-c" in service.observed()


def test_an_empty_batch_is_a_heartbeat(service: Service) -> None:
    assert service.post(batch()).json() == {"accepted": 0, "pair_samples": 0}
    view = httpx.get(f"{service.url}/observations").json()
    assert view["agents"]["g0"]["last_report_age_seconds"] < 30


def test_agents_are_kept_only_for_nodes_of_the_cluster(service: Service) -> None:
    """Each agent's last report is kept per node and exported as a metric label: a batch
    naming a node the cluster lacks is refused, and a node that left is forgotten, so
    neither invented names nor autoscaler churn grow the map or the metric."""
    for i in range(20):
        reply = service.post(batch(window("uid-a", 1.0), node=f"ghost-{i}"))
        assert reply.status_code == 422, reply.text
        assert reply.json()["Error"].startswith("node: 'ghost-")
        assert reply.json()["refused"] == [0]
    service.api.put("nodes", gpu_node("g1", 1))
    assert wait_for(lambda: service.engine.cluster.state.node("g1") is not None)
    service.epoch()
    assert service.post(batch(node="g1")).status_code == 200
    assert service.post(batch()).status_code == 200
    agents = httpx.get(f"{service.url}/observations").json()["agents"]
    assert set(agents) == {"g0", "g1"}

    service.api.delete("nodes", "g1")
    assert wait_for(lambda: service.engine.cluster.state.node("g1") is None)
    service.epoch()
    assert service.post(batch()).status_code == 200
    assert set(httpx.get(f"{service.url}/observations").json()["agents"]) == {"g0"}
    metrics = httpx.get(f"{service.url}/metrics").text
    assert 'node="g0"' in metrics and "ghost" not in metrics and 'node="g1"' not in metrics


def test_windows_for_a_pod_on_another_node_are_refused(service: Service) -> None:
    """An agent reports the pods of its own node: a window for a pod bound elsewhere (an
    agent started with the wrong NODE_NAME, or a pod UID copied from another node) would
    be kept under the wrong node and teach pairs that node never ran, so the batch is
    refused naming the pod, and nothing is recorded."""
    service.api.put("nodes", gpu_node("g1", 1))
    assert wait_for(lambda: service.engine.cluster.state.node("g1") is not None)
    service.epoch()
    reply = service.post(batch(window("uid-c", SOLO), node="g1"))
    assert reply.status_code == 422, reply.text
    assert reply.json()["Error"].startswith("observations[0].pod_uid: ")
    assert "'g0'" in reply.json()["Error"] and "'g1'" in reply.json()["Error"]
    assert reply.json()["refused"] == [0]
    service.epoch()
    assert service.observed() == {}
    assert service.post(batch(window("uid-c", SOLO))).status_code == 200


def test_what_was_learned_survives_a_restart(tmp_path: Path) -> None:
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 2))
    api.put("pods", running_pod("a", "g0", 0))
    api.put("pods", running_pod("b", "g0", 0))
    store = str(tmp_path / "loop.db")
    try:
        server, _, svc = start_service(api, observation_store=store)
        svc.epoch()
        # launches/s has no profile reference: a's solo windows set it
        api.delete("pods", "ml/b")
        assert wait_for(lambda: svc.engine.cluster.state.pod_by_name("ml", "b") is None)
        svc.epoch()
        solo = {"pod_uid": "uid-a", "end": time.time(), "seconds": 5.0, "rate": 400.0,
                "unit": "launches/s"}  # fmt: skip
        assert svc.post(batch(solo)).status_code == 200
        server.stop()
        api.put("pods", running_pod("b", "g0", 0))
        server, kube, svc = start_service(api, observation_store=store)
        assert wait_for(lambda: len(kube.state.pods()) == 2)
        svc.epoch()
        shared = {**solo, "end": time.time(), "rate": 200.0}
        assert svc.post(batch(shared)).status_code == 200
        svc.epoch()
        assert svc.observed()["uid-a"].slowdown == pytest.approx(2.0)
        assert svc.observed()["uid-a"].partners == ("uid-b",)
        # measured alone before the restart, still known as such after it (no profile
        # margin on its evidence): the one store keeps whether a reference was solo
        assert svc.observed()["uid-a"].solo_reference
        server.stop()
    finally:
        api.stop()


def test_a_separation_by_the_plan_is_reported_with_its_reason(service: Service) -> None:
    """a and b share GPU 0 and are observed; when c leaves GPU 1 the plan moves one of them
    there (never co-locate while a fitting GPU is idle): REST and metrics say so, once.
    Only a pod that allows migration is moved (a plan that moves a pod nothing would evict
    reported a separation that never happened)."""
    for name in ("a", "b"):
        service.api.put("pods", running_pod(name, "g0", 0, migration="allowed"))
    assert wait_for(lambda: all(service.engine.cluster.state.pod_by_name("ml", n)["metadata"]
                                ["annotations"].get("elastico.io/migration") == "allowed"
                                for n in ("a", "b")))  # fmt: skip
    reply = service.post(batch(window("uid-a", SOLO / 1.4), window("uid-b", SOLO / 1.4)))
    assert reply.json() == {"accepted": 2, "pair_samples": 2}
    service.epoch()
    view = httpx.get(f"{service.url}/observations").json()
    assert view["separations"] == []
    service.api.delete("pods", "ml/c")
    assert wait_for(lambda: service.engine.cluster.state.pod_by_name("ml", "c") is None)
    plan = service.epoch()
    moved = [a for a in plan["assignments"].values() if a["action"] == "migrate"]
    assert [m["devices"] for m in moved] == [["g0/1"]], plan["assignments"]
    service.epoch()  # the plan is looked at when the next snapshot is built
    view = httpx.get(f"{service.url}/observations").json()
    (sep,) = view["separations"]
    assert sep["action"] == "migrate" and {sep["victim"], sep["partner"]} == {"ml/a", "ml/b"}
    assert sep["observed_slowdown"] == pytest.approx(1.4)
    assert (
        "migrate to" in sep["why"]
        and "g0/1" in sep["why"]
        and "observed slowdown 1.40" in (sep["why"])
    )
    assert all(p["separated"] for p in view["pairs"])
    metrics = httpx.get(f"{service.url}/metrics").text
    assert 'elastico_pairs_separated_total{action="migrate"} 1.0' in metrics
    assert "elastico_observed_slowdown{" not in metrics  # separated pairs leave the gauge


def test_a_pair_observed_above_tolerance_for_k_windows_is_separated(service: Service) -> None:
    """a and b share GPU 0, c holds GPU 1: no idle GPU, so the plan keeps the pair until
    observations say it hurts; then a reconfiguration or a move must reach the pods."""
    for name in ("a", "b"):  # moves are carried out for pods that allow them
        service.api.put("pods", running_pod(name, "g0", 0, migration="allowed"))
    assert wait_for(
        lambda: all(
            (service.engine.cluster.state.pod_by_name("ml", n) or {})["metadata"]["annotations"]
            .get("elastico.io/migration") == "allowed"
            for n in ("a", "b")
        )
    )  # fmt: skip
    service.epoch()
    before = {
        name: dict(service.api.objects["pods"][f"ml/{name}"]["metadata"]["annotations"])
        for name in ("a", "b")
    }

    def acted() -> list[str]:
        """Pods whose configuration or devices changed on the API server, or evicted."""
        found = [e["metadata"]["name"] for e in service.api.evictions]
        for name in ("a", "b"):
            now = service.api.objects["pods"].get(f"ml/{name}", {}).get("metadata", {})
            notes = now.get("annotations", {})
            for key in ("elastico.io/assigned-configuration", "elastico.io/assigned-devices"):
                if notes and notes.get(key) != before[name][key]:
                    found.append(name)
        return found

    plans = []
    for _ in range(4):  # k windows (>= the planner's documented k), one epoch apart
        time.sleep(0.01)
        items = (window("uid-a", SOLO / 3.0), window("uid-b", SOLO / 3.0))
        assert service.post(batch(*items)).status_code == 200
        plans.append(service.epoch())
        if acted():
            break
    assert acted(), plans[-1]
    service.epoch()  # the separating plan is read when the next snapshot is built
    view = httpx.get(f"{service.url}/observations").json()
    assert view["separations"] and "observed slowdown" in view["separations"][0]["why"]
    assert not math.isnan(view["separations"][0]["observed_slowdown"])
    # pods are named namespace/name, never by uid (a pair goes with a pod that left)
    named = [view["separations"][0].get(k) for k in ("victim", "partner")]
    named += [p[k] for p in view["pairs"] for k in ("victim", "partner")]
    named += [partner for p in view["pods"] for partner in p["partners"]]
    assert named and all(n.startswith("ml/") for n in named), view


def _pair_features(svc: Service, victim: str, partner: str) -> np.ndarray:
    """The 36 IAC features of ``victim`` next to ``partner`` as the planner builds them."""
    snap = svc.engine.published.snapshot
    jobs = {j.id: j for j in snap.jobs}
    a, b = jobs[victim], jobs[partner]
    node, index = a.devices[0]
    gib = next(g.memory_mib for n in snap.nodes if n.name == node for g in n.gpus
               if g.index == index) / 1024.0  # fmt: skip
    return pair_features(
        snap.families[a.family].features[[a.current_config]],
        snap.families[b.family].features[[b.current_config]],
        np.array([gib]),
    )


def test_observed_pairs_correct_the_planners_predictor_and_survive_a_restart(
    tmp_path: Path,
) -> None:
    """Observed beats predicted: the windows of a pair teach the online correction the
    planner asks, and what it learned is there again after a restart."""
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 2))
    api.put("pods", running_pod("a", "g0", 0))
    api.put("pods", running_pod("b", "g0", 0))
    store = str(tmp_path / "loop.db")
    try:
        server, _, svc = start_service(api, observation_store=store)
        svc.epoch()
        x = _pair_features(svc, "uid-a", "uid-b")
        before = float(svc.engine.predictor.predict(x)[0])
        start = time.time() - 60
        for i in range(8):  # a runs at 1/2.5 of its profile's solo rate next to b
            item = window("uid-a", SOLO / 2.5, end=start + 5 * i)
            assert svc.post(batch(item)).status_code == 200
        learned = float(svc.engine.predictor.predict(x)[0])
        assert abs(learned - 2.5) < abs(before - 2.5)
        assert learned == pytest.approx(2.5, rel=0.15)
        server.stop()
        server, kube, svc = start_service(api, observation_store=store)
        assert wait_for(lambda: len(kube.state.pods()) == 2)
        svc.epoch()
        assert float(svc.engine.predictor.predict(x)[0]) == pytest.approx(learned, rel=1e-6)
        server.stop()
    finally:
        api.stop()


def test_the_planners_predictions_wait_while_the_correction_changes(service: Service) -> None:
    """The epoch thread predicts while agents' windows teach the correction: the engine's
    predictor must not read a half-applied update (it waits on the correction's lock)."""
    import threading

    observations = service.app.state.observations  # type: ignore[attr-defined]
    predictor = service.engine.predictor
    families = catalog_families()
    bert = families["bert"].features[:1]
    x = pair_features(bert, bert, np.array([80.0]))
    answers: list[np.ndarray] = []
    with observations.correction_lock:  # as a learning step would hold it
        worker = threading.Thread(target=lambda: answers.append(predictor.predict(x)))
        worker.start()
        worker.join(0.3)
        assert worker.is_alive() and not answers  # blocked until the update is complete
    worker.join(5.0)
    assert answers and np.allclose(answers[0], observations.loop.correction.predict(x))


def test_a_pod_that_started_shared_is_measured_against_its_familys_solo_rate(
    tmp_path: Path,
) -> None:
    """Launch rates have no profile reference: a pod bound next to a partner was never
    protected.  Its family's solo launch rate on the same GPU model (pod c, alone on GPU 1)
    is its reference, and that survives a restart through the store."""
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 2))
    for name, device in (("a", 0), ("b", 0), ("c", 1)):
        api.put("pods", running_pod(name, "g0", device))
    store = str(tmp_path / "loop.db")
    try:
        server, kube, svc = start_service(api, observation_store=store)
        assert wait_for(lambda: len(kube.state.pods()) == 3)
        svc.epoch()

        def launches(uid: str, rate: float) -> dict:
            return window(uid, rate, unit="launches/s")

        assert svc.post(batch(launches("uid-c", 400.0))).status_code == 200
        assert svc.post(batch(launches("uid-a", 200.0))).status_code == 200
        svc.epoch()
        seen = svc.observed()["uid-a"]
        assert seen.slowdown == pytest.approx(2.0)
        assert seen.reference == "family" and seen.partners == ("uid-b",)
        pods = {p["id"]: p for p in httpx.get(f"{svc.url}/observations").json()["pods"]}
        assert pods["uid-a"]["reference"] == "family"
        server.stop()

        server, kube, svc = start_service(api, observation_store=store)
        assert wait_for(lambda: len(kube.state.pods()) == 3)
        svc.epoch()
        assert svc.post(batch(launches("uid-b", 100.0))).status_code == 200
        svc.epoch()
        assert svc.observed()["uid-b"].slowdown == pytest.approx(4.0)
        assert svc.observed()["uid-b"].reference == "family"
        server.stop()
    finally:
        api.stop()


def test_pods_that_cannot_be_measured_reach_the_planner(service: Service) -> None:
    """a and b share GPU 0 and report launch rates, which no profile states, and neither
    they nor their family (bert) ran alone: no slowdown, and the snapshot says so (the
    planner runs them alone first: tests/test_core_protect.py)."""
    items = (window("uid-a", 200.0, unit="launches/s"), window("uid-b", 200.0, unit="launches/s"))
    assert service.post(batch(*items)).status_code == 200
    service.epoch()
    snapshot = service.engine.published.snapshot
    assert snapshot.observed == {}
    assert snapshot.unmeasured.keys() == {"uid-a", "uid-b"}
    # c, alone on GPU 1, measures the family: a and b are measured from then on
    solo = window("uid-c", 400.0, unit="launches/s")
    assert service.post(batch(solo)).status_code == 200
    assert service.post(batch(*(dict(w, end=time.time()) for w in items))).status_code == 200
    service.epoch()
    snapshot = service.engine.published.snapshot
    assert snapshot.unmeasured == {}
    assert snapshot.observed["uid-a"].slowdown == pytest.approx(2.0)


def test_a_multi_gpu_pod_next_to_the_same_pair_on_each_gpu_teaches_that_pair(
    tmp_path: Path,
) -> None:
    """A two-GPU pod shares each of its GPUs with one bert pod of the same configuration:
    its windows say what that pair costs it (it runs at its slowest GPU's pace, and both
    GPUs hold the same pair), so the correction the planner asks learns it.  Before,
    a window with two partners taught nothing and this direction was never learned."""
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 2))
    api.put("pods", two_gpu_pod("m", "g0"))
    api.put("pods", running_pod("p", "g0", 0))
    api.put("pods", running_pod("q", "g0", 1))
    try:
        server, kube, svc = start_service(api, observation_store=str(tmp_path / "loop.db"))
        assert wait_for(lambda: len(kube.state.pods()) == 3)
        svc.epoch()
        jobs = {j.id: j for j in svc.engine.published.snapshot.jobs}
        assert len(jobs["uid-m"].devices) == 2
        x = _pair_features(svc, "uid-m", "uid-p")
        before = float(svc.engine.predictor.predict(x)[0])
        start = time.time() - 60
        for i in range(8):  # m runs at half its profile's solo rate next to p and q
            reply = svc.post(batch(window("uid-m", SOLO / 2.0, end=start + 5 * i)))
            assert reply.status_code == 200, reply.text
        learned = float(svc.engine.predictor.predict(x)[0])
        assert abs(learned - 2.0) < abs(before - 2.0)
        assert learned == pytest.approx(2.0, rel=0.15)
        server.stop()
    finally:
        api.stop()


def test_a_multi_gpu_pod_next_to_a_known_and_an_unknown_partner_teaches_the_unknown_pair(
    tmp_path: Path,
) -> None:
    """A two-GPU bert pod shares GPU 0 with a bert pod, then a resnet50 pod starts on its
    GPU 1.  The first pair is known from the windows it had alone with its partner (at
    1.2); the windows with both partners read 2.0, which the known pair cannot explain,
    so they teach the new pair, and the known one keeps what it learned.  Before, a
    window with partners of two kinds taught nothing."""
    resnet = catalog_families()["resnet50"]
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 2))
    api.put("pods", two_gpu_pod("m", "g0"))
    api.put("pods", running_pod("p", "g0", 0))
    try:
        server, kube, svc = start_service(api, observation_store=str(tmp_path / "loop.db"))
        assert wait_for(lambda: len(kube.state.pods()) == 2)
        svc.epoch()
        known = _pair_features(svc, "uid-m", "uid-p")
        start = time.time() - 90
        for i in range(4):  # next to p alone: that pair is learned
            reply = svc.post(batch(window("uid-m", SOLO / 1.2, end=start + 5 * i)))
            assert reply.status_code == 200, reply.text
        learned_known = float(svc.engine.predictor.predict(known)[0])
        assert learned_known == pytest.approx(1.2, rel=0.1)
        other = running_pod("q", "g0", 1, family="resnet50")
        label = resnet.configs[resnet.fastest_index].label
        other["metadata"]["annotations"]["elastico.io/assigned-configuration"] = label
        api.put("pods", other)
        assert wait_for(lambda: len(kube.state.pods()) == 3)
        svc.epoch()
        new = _pair_features(svc, "uid-m", "uid-q")
        before = float(svc.engine.predictor.predict(new)[0])
        for i in range(8):  # next to p and q: 2.0, which only the new pair can be
            reply = svc.post(batch(window("uid-m", SOLO / 2.0, end=start + 30 + 5 * i)))
            assert reply.status_code == 200, reply.text
        learned = float(svc.engine.predictor.predict(new)[0])
        assert abs(learned - 2.0) < abs(before - 2.0)
        assert learned == pytest.approx(2.0, rel=0.15)
        assert float(svc.engine.predictor.predict(known)[0]) == pytest.approx(learned_known)
        server.stop()
    finally:
        api.stop()


def test_a_store_that_refuses_writes_at_shutdown_is_a_warning_not_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A full or read-only disk at shutdown: the correction cannot be saved (the leader's
    checkpoint holds it), which is said once; the store is closed all the same. Before,
    the error escaped the app's shutdown (a traceback, "Application shutdown failed")."""
    import sqlite3

    from elastico_extender.core.closed_loop import ClosedLoop
    from elastico_extender.core.interference.online import OnlineCorrection
    from elastico_extender.core.interference.predictor import ContentionPredictor
    from elastico_extender.profiles.loop_store import LoopStore
    from elastico_extender.service.observations import ObservationService

    store = LoopStore(tmp_path / "loop.db")
    correction = OnlineCorrection(ContentionPredictor())
    observed = ObservationService(ServiceSettings(), store, loop=ClosedLoop(correction))
    store._db.execute("PRAGMA query_only = ON")  # every write refused, as on a read-only disk
    with caplog.at_level("WARNING"):
        observed.close()
    said = [r for r in caplog.records if r.getMessage() == "observations.loop_not_saved"]
    assert [r.path for r in said] == [str(tmp_path / "loop.db")]  # the file is named
    with pytest.raises(sqlite3.ProgrammingError):  # closed
        store.pair_records()
