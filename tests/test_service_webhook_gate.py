"""A pod created while the webhook was down is never bound as an elastic tenant: it
has no env and no decision file, so nothing would enforce a shared budget (issue 12
item 3).  It may only take whole idle GPUs, bound without a decision, and filter says
why it may not share."""

from __future__ import annotations

from test_service_behaviour import elastic_pod, gpu_node, raw_elastic_pod

from elastico_extender.cluster.base import BindRequest
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.engine import Engine
from elastico_extender.service.settings import ServiceSettings


class RecordingCluster(EmbeddedCluster):
    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.requests: list[BindRequest] = []

    def bind(self, request: BindRequest) -> None:
        self.requests.append(request)
        super().bind(request)


def unmutated(name: str, family: str = "resnet50") -> dict:
    return raw_elastic_pod(name, family)


def test_a_pod_the_webhook_never_saw_takes_a_whole_gpu_without_a_decision():
    cluster = RecordingCluster([gpu_node("g0", gpus=2)], "test")
    cluster.add_pod(elastic_pod("tenant", "resnet50"))  # admitted through the webhook
    cluster.add_pod(unmutated("bare"))
    engine = Engine(ServiceSettings(epoch_seconds=3600), cluster)
    engine.run_epoch()
    assert engine.bind("ml", "tenant", "uid-tenant", "g0") == ""
    assert cluster.requests[0].annotations  # the elastic tenant got its decision
    bare = cluster.state.pod("uid-bare")
    assert engine.filter(bare, ["g0"]).passed == ["g0"]  # GPU 1 is idle
    assert engine.bind("ml", "bare", "uid-bare", "g0") == ""
    request = cluster.requests[1]
    assert request.configmap is None  # no budget to enforce: where it is counted, no more
    assert request.annotations == {"elastico.io/assigned-node": "g0",
                                   "elastico.io/assigned-devices": "1"}  # fmt: skip
    engine.run_epoch()
    gpus = {g["index"]: g["pods"] for g in engine.nodes()[0]["gpus"]}
    assert "ml/bare" in gpus[1] and gpus[1] == ["ml/bare"]  # alone on its GPU
    rows = {r.get("pod"): r for r in engine.jobs()}
    assert "webhook" in (rows["ml/bare"]["reason"] or "")


def test_filter_says_why_a_pod_the_webhook_never_saw_may_not_share():
    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    cluster.add_pod(elastic_pod("tenant", "resnet50"))
    engine = Engine(ServiceSettings(epoch_seconds=3600), cluster)
    engine.run_epoch()
    assert engine.bind("ml", "tenant", "uid-tenant", "g0") == ""
    engine.run_epoch()  # a plan with the tenant running: its tau lets a twin share
    assert engine.filter(elastic_pod("twin", "resnet50"), ["g0"]).passed == ["g0"]  # shares
    outcome = engine.filter(unmutated("bare"), ["g0"])
    assert outcome.passed == []
    reason = {**outcome.failed, **outcome.unresolvable}["g0"]
    assert "webhook" in reason and "whole idle GPU" in reason
