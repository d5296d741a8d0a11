"""A forged filter or prioritize body cannot change how a real pod is planned or bound.

The verbs are unauthenticated (kube-scheduler calls them), and a pod's uid and
resourceVersion are public (``/jobs``).  The pod-to-job cache was keyed by those two
alone, so a body carrying a real pod's uid and resourceVersion with other annotations
was cached as that pod's job: the scheduler's own filter call then read the forgery,
and so did the planner and bind.  Real uvicorn on 127.0.0.1, the embedded cluster.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import httpx
import pytest

from elastico_extender.api.app import create_app
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings

PENDING = "llama3-batch-infer"  # a pending pod of the embedded demo cluster


@pytest.fixture()
def served() -> Iterator[tuple[httpx.Client, EmbeddedCluster]]:
    cluster = EmbeddedCluster.from_file()
    app = create_app(ServiceSettings(epoch_seconds=600), cluster)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        yield client, cluster


def real_pod(cluster: EmbeddedCluster) -> dict:
    pod = cluster.state.pod_by_name("ml", PENDING)
    assert pod is not None
    return copy.deepcopy(pod)


def filter_body(pod: dict) -> dict:
    return {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-a100-0", "gpu-a100-1"]}


def test_a_forged_body_does_not_become_the_real_pods_job(served):
    client, cluster = served
    genuine = real_pod(cluster)
    forged = copy.deepcopy(genuine)
    forged["metadata"]["annotations"]["elastico.io/min-throughput"] = "abc"
    answer = client.post("/scheduler/filter", json=filter_body(forged)).json()
    assert "elastico.io/min-throughput" in str(answer)  # the forgery itself is refused
    answer = client.post("/scheduler/filter", json=filter_body(genuine)).json()
    assert not answer.get("Error"), answer
    assert "invalid annotations" not in str(answer.get("FailedNodes")), answer
    assert answer["NodeNames"], answer
    jobs = client.get("/jobs", params={"limit": 500}).json()
    mine = [j for j in jobs["items"] if j["id"] == genuine["metadata"]["uid"]]
    assert mine and mine[0]["state"] != "invalid", mine


def test_a_body_is_answered_for_its_own_content(served):
    """The same uid and resourceVersion with another GPU request is another question."""
    client, cluster = served
    genuine = real_pod(cluster)
    wide = copy.deepcopy(genuine)
    for container in wide["spec"]["containers"]:
        container.setdefault("resources", {}).setdefault("limits", {})["nvidia.com/gpu"] = "8"
    client.post("/scheduler/filter", json=filter_body(wide))
    answer = client.post("/scheduler/filter", json=filter_body(genuine)).json()
    assert "needs 8" not in str(answer), answer
    assert answer["NodeNames"], answer


def test_the_cache_answers_each_pod_object_for_its_own_content():
    """The poisoning order, one cache down: a forged object of the pod is asked about
    first (after a flood pushed the real one out), then the real one."""
    from elastico_extender.service.families import FamilyResolver
    from elastico_extender.service.pods import PodJobs

    genuine = real_pod(EmbeddedCluster.from_file())
    forged = copy.deepcopy(genuine)
    forged["metadata"]["annotations"]["elastico.io/weight"] = "77"
    jobs = PodJobs(FamilyResolver(40960.0))
    assert jobs.get(forged).job.weight == 77
    assert jobs.get(genuine).job.weight != 77
    noisy = copy.deepcopy(genuine)
    noisy["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update"}]
    before = len(jobs)
    jobs.get(noisy)  # the server's field bookkeeping is not the pod's content
    assert len(jobs) == before
