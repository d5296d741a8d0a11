"""A replacement pod continues the job of the pod ElastiCo evicted (service.succession).

The service side runs under uvicorn on 127.0.0.1 with the real kubernetes client
against the project's fake API server (real Pod JSON, list/watch, the Eviction
subresource); the controller's replacement is created the way a Job controller
creates one: a new pod, new name and uid, same controller owner.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from test_learned_checkpoint import CM, NS, Replica, payload_of
from test_service_observations import (
    Service,
    gpu_node,
    running_pod,
    start_service,
    wait_for,
)

from elastico_extender.cluster.fake_apiserver import FakeApiServer
from elastico_extender.core.model import Job
from elastico_extender.profiles.loop_snapshot import CorruptSnapshot, LearnedState, decode, encode
from elastico_extender.service.succession import Succession

HOUR = 3600.0


def stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def started_pod(name: str, created: float, started: float, gpus: int = 1) -> dict:
    """A running pod, bound by the extender, created and started at the given times."""
    pod = running_pod(name, "g0", 0, migration="allowed")
    pod["metadata"]["creationTimestamp"] = stamp(created)
    pod["status"]["startTime"] = stamp(started)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
    return pod


def replacement(of: dict, name: str, created: float) -> dict:
    """What the pod's Job controller creates after an eviction: a new pending pod."""
    pod = running_pod(name, "g0", 0)
    pod["metadata"]["creationTimestamp"] = stamp(created)
    pod["metadata"]["ownerReferences"] = of["metadata"]["ownerReferences"]
    for key in ("assigned-node", "assigned-devices", "assigned-configuration"):
        del pod["metadata"]["annotations"][f"elastico.io/{key}"]
    del pod["spec"]["nodeName"]
    pod["status"] = {"phase": "Pending"}
    return pod


def job_of(pod: dict) -> Job:
    return Job(pod["metadata"]["uid"], "bert", gpus=2, arrival_time=0.0)


def test_the_replacement_takes_the_jobs_arrival_and_attained_service() -> None:
    now = 1_000_000.0
    old = started_pod("a", created=now - 3 * HOUR, started=now - 2 * HOUR, gpus=2)
    book = Succession()
    book.evicted(old, job_of(old), now)
    other = started_pod("z", created=now + 5, started=now + 6)  # another controller's pod
    other["metadata"]["ownerReferences"][0]["uid"] = "owner-z"
    new = replacement(old, "a-2", created=now + 10)
    pods = {p["metadata"]["uid"]: p for p in (other, new)}
    jobs = [
        Job("uid-z", "bert", arrival_time=now + 5),
        Job("uid-a-2", "bert", gpus=2, arrival_time=now + 10),
    ]
    out = book.continued(jobs, pods, now + 20)
    assert out[0] is jobs[0]  # not a replacement: untouched
    assert out[1].arrival_time == pytest.approx(now - 3 * HOUR)
    assert out[1].attained_gpu_seconds == pytest.approx(2 * 2 * HOUR)
    assert book.ran_before("uid-a-2") == pytest.approx(2 * HOUR)
    # Next epoch, the same job object: the same copy (downstream caches keyed on it hit).
    assert book.continued(jobs, pods, now + 80)[1] is out[1]
    # Evicted again after an hour's run: the third pod carries both runs.
    new["status"] = {"phase": "Running", "startTime": stamp(now + HOUR)}
    book.evicted(new, out[1], now + 2 * HOUR)
    third = replacement(old, "a-3", created=now + 2 * HOUR + 1)
    got = book.continued([Job("uid-a-3", "bert", gpus=2)], {"uid-a-3": third}, now + 2 * HOUR + 2)
    assert got[0].arrival_time == pytest.approx(now - 3 * HOUR)
    assert got[0].attained_gpu_seconds == pytest.approx(2 * 3 * HOUR)
    assert book.ran_before("uid-a-3") == pytest.approx(3 * HOUR)


def test_a_pod_older_than_the_eviction_or_too_late_claims_nothing() -> None:
    now = 1_000_000.0
    old = started_pod("a", created=now - HOUR, started=now - HOUR)
    sibling = replacement(old, "a-sibling", created=now - 60)  # existed before the eviction
    book = Succession(expiry_s=600)
    book.evicted(old, job_of(old), now)
    job = Job("uid-a-sibling", "bert", arrival_time=now - 60)
    assert book.continued([job], {"uid-a-sibling": sibling}, now + 1)[0] is job
    late = replacement(old, "a-late", created=now + 700)
    job = Job("uid-a-late", "bert", arrival_time=now + 700)
    assert book.continued([job], {"uid-a-late": late}, now + 701)[0] is job  # expired


def test_the_records_are_bounded_and_a_pod_without_controller_is_not_recorded() -> None:
    now = 1_000_000.0
    book = Succession(capacity=3)
    evicted = []
    for k in range(10):
        pod = started_pod(f"p{k}", created=now - HOUR, started=now - HOUR)
        pod["metadata"]["ownerReferences"][0]["uid"] = f"owner-{k}"
        book.evicted(pod, job_of(pod), now)
        evicted.append(pod)
    orphan = started_pod("orphan", created=now - HOUR, started=now - HOUR)
    orphan["metadata"]["ownerReferences"] = []
    book.evicted(orphan, job_of(orphan), now)
    pods = {f"uid-r{k}": replacement(evicted[k], f"r{k}", now + 1) for k in range(10)}
    pods["uid-r-orphan"] = replacement(orphan, "r-orphan", now + 1)
    jobs = [Job(uid, "bert", arrival_time=now + 1) for uid in pods]
    carried = [j.id for j in book.continued(jobs, pods, now + 2) if j.arrival_time < now]
    assert carried == ["uid-r7", "uid-r8", "uid-r9"]  # the newest three records only


@pytest.fixture
def crowded(tmp_path: Path) -> Iterator[Service]:
    """a and b share GPU 0 of g0; GPU 1 is idle, so the plan moves one of them."""
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 2))
    now = time.time()
    for name in ("a", "b"):
        api.put("pods", started_pod(name, created=now - 3 * HOUR, started=now - 2 * HOUR))
    server, kube, svc = start_service(api, observation_store=str(tmp_path / "loop.db"))
    assert wait_for(lambda: len(kube.state.pods()) == 2)
    yield svc
    server.stop()
    api.stop()


def test_an_evicted_pods_replacement_keeps_its_place_in_the_queue(crowded: Service) -> None:
    """Evicted for a move, the pod's replacement is planned as the same job: arrival
    three hours ago, two GPU-hours of attained service, not a newcomer."""
    service = crowded
    for _ in range(3):
        service.epoch()
        if service.api.evictions:
            break
    assert service.api.evictions, "the plan moved nobody off the shared GPU"
    name = service.api.evictions[0]["metadata"]["name"]
    evicted = started_pod(name, created=0.0, started=0.0)
    service.api.put("pods", replacement(evicted, f"{name}-2", created=time.time()))
    assert wait_for(lambda: service.engine.cluster.state.pod_by_name("ml", f"{name}-2"))
    service.epoch()
    jobs = {j.id: j for j in service.engine.published.snapshot.jobs}
    job = jobs[f"uid-{name}-2"]
    assert job.arrival_time == pytest.approx(time.time() - 3 * HOUR, abs=60)
    assert job.attained_gpu_seconds == pytest.approx(2 * HOUR, abs=60)
    # It finishes after ten minutes of its own: the completion learned is the job's.
    done = replacement(evicted, f"{name}-2", created=time.time() - 600)
    done["metadata"]["uid"] = f"uid-{name}-2"
    done["spec"]["nodeName"] = "g0"
    finished = {"terminated": {"exitCode": 0, "finishedAt": stamp(time.time())}}
    done["status"] = {"phase": "Succeeded", "startTime": stamp(time.time() - 600),
                      "containerStatuses": [{"name": "main", "state": finished}]}  # fmt: skip
    service.api.put("pods", done)
    completions = service.engine.builder.completions

    def learned() -> bool:
        service.epoch()
        return bool(completions.rows(10))

    assert wait_for(learned, 10)
    (uid, completed, _), *_ = completions.rows(10)
    assert uid == f"uid-{name}-2"
    assert completed.duration_s == pytest.approx(2 * HOUR + 600, abs=60)


def test_the_migratable_job_example_opts_in_and_keeps_evictions_off_its_retries() -> None:
    """deploy/examples/training-job-migratable.yaml: what docs/annotations.md promises."""
    import yaml

    from elastico_extender.annotations import parse_intent
    from elastico_extender.service.families import FamilyResolver

    root = Path(__file__).resolve().parents[1]
    job = yaml.safe_load((root / "deploy/examples/training-job-migratable.yaml").read_text())
    template = job["spec"]["template"]
    intent = parse_intent(template["metadata"]["annotations"], FamilyResolver(40960.0))
    assert intent is not None and intent.migration_allowed
    assert template["spec"]["restartPolicy"] == "Never"  # podFailurePolicy requires it
    ignored = [
        condition["type"]
        for rule in job["spec"]["podFailurePolicy"]["rules"]
        if rule["action"] == "Ignore"
        for condition in rule.get("onPodConditions", ())
    ]
    assert "DisruptionTarget" in ignored  # an eviction does not use up backoffLimit


def test_the_records_round_trip_through_the_checkpoint_format() -> None:
    now = 1_000_000.0
    old = started_pod("a", created=now - 3 * HOUR, started=now - 2 * HOUR, gpus=2)
    book = Succession()
    book.evicted(old, job_of(old), now)
    first = replacement(old, "a-2", created=now + 1)
    book.continued([Job("uid-a-2", "bert", gpus=2)], {"uid-a-2": first}, now + 2)
    other = started_pod("c", created=now - HOUR, started=now - HOUR)
    other["metadata"]["ownerReferences"][0]["uid"] = "owner-c"
    book.evicted(other, job_of(other), now + 3)
    payload, _, dropped = encode(LearnedState(succession=book.rows()), 1 << 20)
    assert dropped["succession"] == 0
    restored = Succession()
    assert restored.merge(decode(payload).succession) == 2
    assert restored.rows() == book.rows()
    assert restored.ran_before("uid-a-2") == pytest.approx(2 * HOUR)
    pods = {"uid-c-2": replacement(other, "c-2", now + 4), "uid-a-2": first}
    again = restored.continued([Job("uid-c-2", "bert")], pods, now + 5)
    assert again[0].arrival_time == pytest.approx(now - HOUR)
    assert restored.merge(decode(payload).succession) == 0  # known, or claimed here since


@pytest.mark.parametrize(
    "row",
    [
        ["waiting", "ml/owner", 1.0, -5.0, 0.0, 2.0],  # negative attained service
        ["stolen", "ml/owner", 1.0, 0.0, 0.0, 2.0],  # not a kind
        ["claimed", "", 1.0, 0.0, 0.0, 2.0],  # no key
        ["claimed", "uid", 1.0, 0.0, 0.0],  # a field short
    ],
)
def test_a_corrupt_succession_row_is_refused(row: list) -> None:
    import json
    import zlib

    payload, _, _ = encode(LearnedState(), 1 << 20)
    line, _, body = zlib.decompress(payload).partition(b"\n")
    header = json.loads(line)
    header["succession"] = [row]
    forged = zlib.compress(json.dumps(header).encode() + b"\n" + body)
    with pytest.raises(CorruptSnapshot, match="succession"):
        decode(forged)


def test_the_replacement_keeps_its_place_when_every_replica_restarts(tmp_path: Path) -> None:
    """The leader evicts a pod to move it and dies; the controller's replacement appears
    while no extender runs; a new replica with an empty SQLite file restores the record
    from the checkpoint and plans the replacement as the job it continues."""
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 2))
    now = time.time()
    for name in ("a", "b"):
        api.put("pods", started_pod(name, created=now - 3 * HOUR, started=now - 2 * HOUR))
    a = Replica.start(api, "replica-a", tmp_path / "a.db")
    try:
        assert wait_for(a.elector.is_leader)
        assert wait_for(lambda: len(a.kube.state.pods()) == 2)
        for _ in range(3):
            a.epoch()
            if api.evictions:
                break
        assert api.evictions, "the plan moved nobody off the shared GPU"
        assert wait_for(
            lambda: (NS, CM) in api.configmaps and bool(decode(payload_of(api)).succession)
        )
    finally:
        a.crash()  # killed: no last write, the Lease not released
    name = api.evictions[0]["metadata"]["name"]
    evicted = started_pod(name, created=0.0, started=0.0)
    api.put("pods", replacement(evicted, f"{name}-2", created=time.time()))
    z = Replica.start(api, "replica-z", tmp_path / "z.db")
    try:
        assert wait_for(z.elector.is_leader, timeout=30)
        assert wait_for(lambda: z.kube.state.pod_by_name("ml", f"{name}-2") is not None)
        z.epoch()
        jobs = {j.id: j for j in z.engine.published.snapshot.jobs}
        job = jobs[f"uid-{name}-2"]
        assert job.arrival_time == pytest.approx(now - 3 * HOUR, abs=60)
        assert job.attained_gpu_seconds == pytest.approx(2 * HOUR, abs=60)
    finally:
        z.server.stop()
        api.stop()


def cordoned(node: dict) -> dict:
    """``node`` after ``kubectl cordon``: spec.unschedulable, and the taint the node
    lifecycle controller adds for it."""
    node["spec"] = {"unschedulable": True, "taints": [
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}  # fmt: skip
    return node


@pytest.mark.parametrize("closed", ["cordoned", "tainted"])
def test_no_pod_is_evicted_to_move_it_onto_a_node_it_cannot_be_scheduled_to(
    tmp_path: Path, closed: str
) -> None:
    """a and b share g0's one GPU; g1's GPU is idle, but g1 is cordoned (or tainted
    NoSchedule with a taint the pods do not tolerate): kube-scheduler would never place a
    replacement there, so evicting a pod to move it there only restarts it.  Before, the
    plan's move was carried out all the same; now it is only logged, and carried out once
    the node takes pods again."""
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 1))
    g1 = gpu_node("g1", 1)
    if closed == "cordoned":
        api.put("nodes", cordoned(g1))
    else:
        g1["spec"] = {"taints": [{"key": "maintenance", "value": "bios", "effect": "NoSchedule"}]}
        api.put("nodes", g1)
    now = time.time()
    for name in ("a", "b"):
        api.put("pods", started_pod(name, created=now - 3 * HOUR, started=now - 2 * HOUR))
    server, kube, service = start_service(api, observation_store=str(tmp_path / "loop.db"))
    try:
        assert wait_for(lambda: len(kube.state.pods()) == 2)
        for _ in range(3):
            service.epoch()
        assert api.evictions == []
        api.put("nodes", gpu_node("g1", 1))  # uncordoned: the move is made
        assert wait_for(lambda: not (kube.state.node("g1") or {}).get("spec"))
        for _ in range(3):
            service.epoch()
            if api.evictions:
                break
        assert len(api.evictions) == 1
    finally:
        server.stop()
        api.stop()


def test_closed_to_follows_kube_schedulers_taint_and_toleration_rules() -> None:
    """Tolerations as v1.Toleration.ToleratesTaint matches them: Exists on the key (any
    value), Equal on key and value, an empty effect for every effect, an empty key with
    Exists for every taint; PreferNoSchedule keeps nobody out."""
    from elastico_extender.cluster.objects import closed_to

    node = gpu_node("g1", 1)
    node["spec"] = {"taints": [{"key": "maintenance", "value": "bios", "effect": "NoExecute"}]}
    pod = started_pod("a", created=0.0, started=0.0)
    assert closed_to(node, pod) == (
        "node g1 has the taint maintenance=bios:NoExecute, not tolerated by the pod"
    )
    for tolerations, tolerated in (
        ([{"key": "maintenance", "operator": "Exists"}], True),
        ([{"key": "maintenance", "value": "bios", "effect": "NoExecute"}], True),
        ([{"key": "maintenance", "operator": "Equal", "value": "bios"}], True),
        ([{"operator": "Exists"}], True),
        ([{"key": "maintenance", "value": "disk"}], False),
        ([{"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}], False),
        ([{"key": "other", "operator": "Exists"}], False),
    ):
        pod["spec"]["tolerations"] = tolerations
        assert (closed_to(node, pod) == "") is tolerated, tolerations
    node["spec"] = {"taints": [{"key": "soft", "effect": "PreferNoSchedule"}]}
    pod["spec"]["tolerations"] = []
    assert closed_to(node, pod) == ""
    node = cordoned(gpu_node("g1", 1))
    assert closed_to(node, pod) == "node g1 is cordoned (spec.unschedulable)"
    pod["spec"]["tolerations"] = [{"key": "node.kubernetes.io/unschedulable",
                                   "operator": "Exists", "effect": "NoSchedule"}]  # fmt: skip
    assert closed_to(node, pod) == ""
