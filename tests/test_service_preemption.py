"""Band preemption in the extender: a preempted job is a pod to evict, and only a pod
that allows migration (``elastico.io/migration: allowed``) and has a controller can be
evicted, so the planner chooses its victims among those pods only.

The extender runs under uvicorn on 127.0.0.1 with the real kubernetes client against
the project's fake API server (real Pod JSON, list/watch, the Eviction subresource).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from test_service_observations import Service, gpu_node, running_pod, start_service, wait_for
from test_service_succession import stamp

from elastico_extender.cluster.fake_apiserver import FakeApiServer

HOUR = 3600.0


def long_runner(name: str, device: int, **extra: str) -> dict:
    """A bert pod on GPU ``device`` of g0 for nine hours (band 2 of attained service)."""
    pod = running_pod(name, "g0", device, **extra)
    pod["metadata"]["creationTimestamp"] = stamp(time.time() - 10 * HOUR)
    pod["status"]["startTime"] = stamp(time.time() - 9 * HOUR)
    return pod


def newcomer(name: str) -> dict:
    """A bert pod created a minute ago, waiting for the extender (band 0)."""
    pod = running_pod(name, "g0", 0)
    pod["metadata"]["creationTimestamp"] = stamp(time.time() - 60)
    for key in ("assigned-node", "assigned-devices", "assigned-configuration"):
        del pod["metadata"]["annotations"][f"elastico.io/{key}"]
    del pod["spec"]["nodeName"]
    pod["status"] = {"phase": "Pending"}
    return pod


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    server.put("nodes", gpu_node("g0", 2, memory_mib=40960))  # bert does not share these
    yield server
    server.stop()


def jobs_of(service: Service) -> dict[str, dict]:
    """GET /jobs, by pod name."""
    reply = httpx.get(f"{service.url}/jobs", timeout=30)
    assert reply.status_code == 200, reply.text
    return {row["pod"].split("/")[-1]: row for row in reply.json()}


def plan_of(service: Service) -> dict:
    """GET /plan after one more epoch."""
    service.epoch()
    reply = httpx.get(
        f"{service.url}/plan", headers={"Authorization": f"Bearer {service.token}"}, timeout=30
    )
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.fixture
def service(api: FakeApiServer, request: pytest.FixtureRequest) -> Iterator[Service]:
    """Two long runners on g0's two GPUs (``long-1`` with the test's annotations) and a
    newcomer that fits nowhere: the case band preemption is for."""
    api.put("pods", long_runner("long-0", 0))
    api.put("pods", long_runner("long-1", 1, **request.param))
    api.put("pods", newcomer("fresh"))
    server, kube, svc = start_service(api)
    assert wait_for(lambda: len(kube.state.pods()) == 3)
    yield svc
    server.stop()


@pytest.mark.parametrize("service", [{}], indirect=True)
def test_a_pod_that_cannot_be_evicted_is_no_victim_and_nobody_is_promised_its_gpu(
    service: Service,
) -> None:
    """Both long runners keep the default ``migration: never``: nothing would evict them,
    so the plan preempts neither and the newcomer waits, promised no GPU."""
    plan = plan_of(service)
    assert plan["preempted"] == []
    assert "uid-fresh" in plan["queued"] and "uid-fresh" not in plan["assignments"]
    assert service.api.evictions == []
    # GET /jobs says why: neither runner may be stopped or moved
    assert not jobs_of(service)["long-0"]["preemptible"]
    assert not jobs_of(service)["long-1"]["preemptible"]


@pytest.mark.parametrize("service", [{"migration": "allowed"}], indirect=True)
def test_the_evictable_pod_is_the_victim(service: Service) -> None:
    """``long-1`` allows migration: it is the pod preempted and evicted, and the
    newcomer takes its GPU once it has left."""
    listed: dict[str, dict] = {}

    def long_1_listed() -> bool:
        listed.update(jobs_of(service))  # one read per check: long-1 may leave after it
        return "long-1" in listed

    assert wait_for(long_1_listed)
    assert listed["long-1"]["preemptible"]
    assert wait_for(lambda: bool(plan_of(service) and service.api.evictions))
    assert [e["metadata"]["name"] for e in service.api.evictions] == ["long-1"]
    assert jobs_of(service)["fresh"]["preemptible"] is False  # its migration is "never"
    pods = service.engine.cluster.state
    assert wait_for(lambda: pods.pod_by_name("ml", "long-1") is None)
    assert plan_of(service)["assignments"]["uid-fresh"]["devices"] == ["g0/1"]
