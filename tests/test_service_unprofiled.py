"""Unknown workloads through the real service (issue 11, Learn; spec 4.1).

A pod names a family the catalog lacks and declares its kind: it runs alone
(an unprofiled family demands the whole device).  When its node agent posts a
solo window with peak memory and SM activity, the extender writes that window
as the family's measured profile, drops the caches that held the old family,
and from the next plan another pod may share its GPU; a restart keeps it.
The extender runs under uvicorn on 127.0.0.1 against the fake API server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_service_events import pending_pod
from test_service_observations import batch, gpu_node, running_pod, start_service, wait_for

from elastico_extender.cluster.fake_apiserver import FakeApiServer
from elastico_extender.core.interference.features import PARAMS, pair_features
from elastico_extender.core.interference.online import OnlineCorrection, pair_keys
from elastico_extender.core.interference.predictor import ContentionPredictor
from elastico_extender.core.model import JobKind
from elastico_extender.profiles.store import ProfileStore
from elastico_extender.service.families import UNPROFILED, FamilyResolver

FAMILY = "mystery-net"
HARDWARE = FamilyResolver(40960.0).hardware


def unprofiled_pod(name: str) -> dict:
    """A running pod of a workload the catalog does not know (its kind declared)."""
    pod = running_pod(name, "g0", 0, family=FAMILY, kind="training")
    notes = pod["metadata"]["annotations"]
    notes["elastico.io/assigned-configuration"] = UNPROFILED.label
    return pod


def solo_window(uid: str, **measured: float) -> dict:
    return {"pod_uid": uid, "end": time.time(), "seconds": 5.0, "rate": 400.0,
            "unit": "launches/s", **measured}  # fmt: skip


def shares_with_u(svc) -> bool:
    assignments = svc.engine.published.plan.assignments
    p, u = assignments.get("uid-p"), assignments.get("uid-u")
    return p is not None and u is not None and set(p.devices) & set(u.devices) != set()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[FakeApiServer, str]]:
    """One 80 GiB GPU, the unprofiled pod u running on it, p pending; the loop's file."""
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 1))
    api.put("pods", unprofiled_pod("u"))
    api.put("pods", pending_pod("p"))
    try:
        yield api, str(tmp_path / "loop.db")
    finally:
        api.stop()


def test_a_solo_window_makes_an_unknown_workload_measured_and_shareable(
    world: tuple[FakeApiServer, str],
) -> None:
    api, path = world
    server, kube, svc = start_service(api, observation_store=path)
    assert wait_for(lambda: len(kube.state.pods()) == 2)
    svc.epoch()
    family = svc.engine.published.snapshot.families[FAMILY]
    assert family.estimated is not None and family.estimated.all()
    assert "uid-u" in svc.engine.published.plan.assignments
    assert "uid-p" not in svc.engine.published.plan.assignments  # u holds the whole GPU

    # a window without SM activity measures nothing; a shared one neither (none here)
    assert svc.post(batch(solo_window("uid-u", peak_mem_mib=8000.0))).status_code == 200
    assert ProfileStore(path).records(FAMILY, HARDWARE) == []
    reply = svc.post(batch(solo_window("uid-u", peak_mem_mib=8000.0, sm_activity=0.3)))
    assert reply.status_code == 200, reply.text
    (record,) = ProfileStore(path).records(FAMILY, HARDWARE)
    assert record.configuration == UNPROFILED
    assert record.resources[1] == 8000.0 and record.resources[0] == 0.3

    svc.epoch()  # the caches let go of the old family: the next plan reads the new one
    family = svc.engine.published.snapshot.families[FAMILY]
    assert family.estimated is not None and not family.estimated.any()
    assert shares_with_u(svc)
    server.stop()

    server, kube, svc = start_service(api, observation_store=path)  # a restart
    assert wait_for(lambda: len(kube.state.pods()) == 2)
    svc.epoch()
    assert not svc.engine.published.snapshot.families[FAMILY].estimated.any()
    assert shares_with_u(svc)
    server.stop()


@pytest.mark.parametrize("peak", [81921.0, 1e6, 1e308])
def test_a_peak_memory_no_gpu_of_the_pod_holds_is_refused_and_learns_nothing(
    world: tuple[FakeApiServer, str], peak: float
) -> None:
    """The pod runs on one 80 GiB GPU: a window saying it peaked above that is impossible
    (a broken agent, or a hostile token holder).  It is refused naming peak_mem_mib, and
    neither the measured profile nor the plan changes: the pod keeps its GPU alone."""
    api, path = world
    server, kube, svc = start_service(api, observation_store=path)
    assert wait_for(lambda: len(kube.state.pods()) == 2)
    svc.epoch()
    reply = svc.post(batch(solo_window("uid-u", peak_mem_mib=peak, sm_activity=0.3)))
    assert reply.status_code == 422, reply.text
    assert "observations[0].peak_mem_mib" in reply.json()["Error"]
    assert "81920" in reply.json()["Error"]
    assert ProfileStore(path).records(FAMILY, HARDWARE) == []
    svc.epoch()
    assignments = svc.engine.published.plan.assignments
    assert assignments["uid-u"].devices == (("g0", 0),)
    assert "uid-p" not in assignments
    server.stop()


def test_unknown_family_without_a_kind_stays_an_annotation_error() -> None:
    """A typo is reported, not run as an unprofiled workload; bad names are refused."""
    import pytest

    from elastico_extender.annotations import parse_intent
    from elastico_extender.errors import AnnotationError, UnknownWorkloadError

    resolver = FamilyResolver(40960.0)
    with pytest.raises(AnnotationError, match=r"elastico\.io/kind"):
        parse_intent({"elastico.io/family": "bret"}, resolver, resolver.unprofiled)
    intent = parse_intent(
        {"elastico.io/family": FAMILY, "elastico.io/kind": "inference"},
        resolver,
        resolver.unprofiled,
    )
    assert intent is not None and intent.family.kind is JobKind.INFERENCE
    for bad in ("bert", "Upper", "x" * 70, "elastico.exclusive-gpu"):
        with pytest.raises(UnknownWorkloadError):
            resolver.unprofiled(bad, JobKind.TRAINING)


def test_the_family_cache_is_bounded(monkeypatch) -> None:
    import elastico_extender.service.families as families

    monkeypatch.setattr(families, "FAMILY_CACHE", 3)
    resolver = FamilyResolver(40960.0)
    for i in range(10):
        resolver.unprofiled(f"w{i}", JobKind.TRAINING)
    assert len(resolver.known()) == 4  # three kept plus the reserved exclusive family


def test_a_profile_store_that_fails_to_read_leaves_the_catalog_family_not_a_failed_epoch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A store file damaged on disk after it was opened (a failing volume): the family's
    read fails. Before, the error escaped the resolver and failed every epoch that built
    the family (no plan published again); now the catalog family stands in, said in the
    log, and is not cached (a later read may succeed)."""
    path = tmp_path / "profiles.db"
    store = ProfileStore(path)
    resolver = FamilyResolver(40960.0, store=store)
    bert = resolver("bert")
    for i in range(400):  # rows enough for pages past the schema's
        store.put(f"w{i}", HARDWARE, bert.configs[0], bert.resources[0], 1.0 + i)
    store.close()
    store = ProfileStore(path)  # opened whole, then damaged under it
    data = bytearray(path.read_bytes())
    data[4096:] = b"\xa5" * (len(data) - 4096)
    data[24:28] = b"\xff\xff\xff\xff"  # the file change counter: SQLite drops its cache
    path.write_bytes(bytes(data))
    resolver = FamilyResolver(40960.0, store=store)
    with caplog.at_level("WARNING"):
        family = resolver("resnet50")
    assert family.workload == "resnet50"
    (said,) = [r for r in caplog.records if r.getMessage() == "families.store_unreadable"]
    assert str(path) in said.error  # type: ignore[attr-defined]
    assert "resnet50" not in resolver.known()
    store.close()


def measure(store: ProfileStore, family, uid: str) -> None:
    """The observation owner's step: a solo window written as the family's profile."""
    from elastico_extender.core.observations import Observation
    from elastico_extender.profiles.observed import record_solo_profile

    window = Observation(uid, 0, time.time(), 5.0, 400.0, peak_mem_mib=8000.0, sm_activity=0.3)
    assert record_solo_profile(store, family, window, measured_at=time.time())


def test_two_unprofiled_workloads_measured_alike_are_two_families_to_the_correction(
    tmp_path: Path,
) -> None:
    """Two of a team's own workloads, both measured alone at the same memory and SM
    activity.  Before, both had every feature of the typical workload of their kind, so
    their rows next to bert were one configuration pair: a window of one next to bert
    counted as an observation of the other (and every unprofiled pair was one family
    pair).  Now each name keeps its own log10_params, also on a row stored before."""
    store = ProfileStore(tmp_path / "profiles.db")
    resolver = FamilyResolver(40960.0, store=store)
    for name in ("team-a-trainer", "team-b-finetune"):
        measure(store, resolver.unprofiled(name, JobKind.TRAINING), f"uid-{name}")
        resolver.forget(name)
    a, b = (resolver.unprofiled(n, JobKind.TRAINING) for n in ("team-a-trainer", "team-b-finetune"))
    assert not a.estimated.any() and not b.estimated.any()  # type: ignore[union-attr]
    bert = resolver("bert").features[0]
    rows = pair_features(np.stack([a.features[0], b.features[0]]), np.stack([bert, bert]), 40.0)
    config, family = pair_keys(rows)
    assert config[0] != config[1] and family[0] != family[1]
    correction = OnlineCorrection(ContentionPredictor())
    correction.learn(rows[:1], [2.5])
    assert correction.observed_windows(rows).tolist() == [1.0, 0.0]

    # A row stored with the shared typical value (an older release): the name's wins.
    old = a.features[0].copy()
    old[PARAMS] = b.features[0, PARAMS]
    store.put("team-a-trainer", HARDWARE, a.configs[0], a.resources[0], 1.0, old)
    resolver.forget("team-a-trainer")
    again = resolver.unprofiled("team-a-trainer", JobKind.TRAINING)
    assert again.features[0, PARAMS] == a.features[0, PARAMS]
    store.close()


def test_a_family_measured_while_it_is_being_built_is_not_hidden_by_the_old_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filter thread reads the store (no measured row yet); the observation thread then
    writes the solo profile and forgets the family; the filter thread's build lands after
    the forget.  Before, that build was cached and hid the measured profile until the LRU
    dropped it; now a build that a forget overtook is used once and not cached."""
    store = ProfileStore(tmp_path / "profiles.db")
    resolver = FamilyResolver(40960.0, store=store)
    read = store.family

    def read_then_measured_meanwhile(base, hardware):
        family = read(base, hardware)
        monkeypatch.setattr(store, "family", read)  # once
        measure(store, family, "uid-u")
        resolver.forget(FAMILY)
        return family

    monkeypatch.setattr(store, "family", read_then_measured_meanwhile)
    assert resolver.unprofiled(FAMILY, JobKind.TRAINING).estimated.all()  # the old build
    family = resolver.unprofiled(FAMILY, JobKind.TRAINING)
    assert family.estimated is not None and not family.estimated.any()


def test_a_pod_job_built_from_a_family_forgotten_meanwhile_is_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race one cache up: a pod's job is built from the old family while the
    family is measured and forgotten (``Engine.forget_family``); the job must not stay
    cached under the pod's resourceVersion, which the measurement does not change."""
    from elastico_extender.service.pods import PodJobs

    store = ProfileStore(tmp_path / "profiles.db")
    resolver = FamilyResolver(40960.0, store=store)
    jobs = PodJobs(resolver)
    build = jobs._build

    def build_then_measured_meanwhile(pod, uid):
        built = build(pod, uid)
        monkeypatch.setattr(jobs, "_build", build)  # once
        measure(store, built.family, uid)
        resolver.forget(FAMILY)
        jobs.forget_family(FAMILY)
        return built

    monkeypatch.setattr(jobs, "_build", build_then_measured_meanwhile)
    pod = unprofiled_pod("u")
    assert jobs.get(pod).family.estimated.all()  # the old build, answered once
    family = jobs.get(pod).family
    assert family.estimated is not None and not family.estimated.any()


def test_a_pending_unprofiled_pod_is_bound_with_its_one_configuration(tmp_path: Path) -> None:
    """An unprofiled workload's one configuration is the knob ``as-is``: the knob check
    bind runs refused its ``-`` (ValueError out of bind: every such pod failed to bind,
    and the webhook's settings for it too).  It binds, its ConfigMap holding
    ``ELASTICO_AS_IS`` (``core.handoff.knob_variable``: a name a shell can read too)."""
    import httpx

    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 1))
    pod = pending_pod("n", family=FAMILY)
    pod["metadata"]["annotations"]["elastico.io/kind"] = "training"
    api.put("pods", pod)
    server, kube, svc = start_service(api, observation_store=str(tmp_path / "loop.db"))
    try:
        assert wait_for(lambda: len(kube.state.pods()) == 1)
        svc.epoch()
        auth = {"Authorization": f"Bearer {svc.token}"}
        bind = {"PodName": "n", "PodNamespace": "ml", "PodUID": "uid-n", "Node": "g0"}
        reply = httpx.post(f"{svc.url}/scheduler/bind", json=bind, headers=auth, timeout=30)
        assert reply.status_code == 200 and not reply.json().get("Error"), reply.text
        notes = api.objects["pods"]["ml/n"]["metadata"]["annotations"]
        assert notes["elastico.io/assigned-configuration"] == UNPROFILED.label
        (configmap,) = [v for (ns, _), v in api.configmaps.items() if ns == "ml"]
        assert configmap["data"]["ELASTICO_AS_IS"] == "1"
    finally:
        server.stop()
        api.stop()
