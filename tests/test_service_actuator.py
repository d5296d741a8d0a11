"""The actuator: the only writer to the cluster.  A reconfiguration that shrinks a
pod's budget is written before the view that counts the freed memory is published
(so the cluster's record of decisions never exceeds a GPU), and only the leader
reshapes running pods."""

from __future__ import annotations

from test_service_behaviour import elastic_pod, gpu_node

from elastico_extender.cluster.base import BindRequest
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.engine import Engine
from elastico_extender.service.settings import ServiceSettings


class Recording(EmbeddedCluster):
    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.engine: Engine | None = None
        self.seen: list[tuple[str, int]] = []  # (pod, epoch of the published plan then)

    def reconfigure(self, request: BindRequest) -> None:
        assert self.engine is not None
        self.seen.append((request.name, self.engine.published.plan.epoch))
        super().reconfigure(request)


def case_one(leader: bool) -> tuple[Recording, Engine]:
    cluster = Recording([gpu_node("g0")], "test")
    cluster.add_pod(elastic_pod("bert-a", "bert"))
    engine = Engine(ServiceSettings(epoch_seconds=3600, min_dwell_seconds=0), cluster,
                    is_leader=lambda: leader)  # fmt: skip
    cluster.engine = engine
    engine.run_epoch()
    assert engine.bind("ml", "bert-a", "uid-bert-a", "g0") == ""
    cluster.add_pod(elastic_pod("resnet-b", "resnet50"))
    return cluster, engine


def test_a_shrinking_reconfiguration_is_written_before_its_view_is_published():
    cluster, engine = case_one(leader=True)
    before = engine.published.plan.epoch
    budget = float(cluster.state.pod("uid-bert-a")["metadata"]["annotations"]
                   ["elastico.io/memory-budget-mib"])  # fmt: skip
    plan = engine.run_epoch()
    assert cluster.seen == [("bert-a", before)]  # written while the old view was published
    assert plan.epoch > before and engine.published.plan is plan
    after = float(cluster.state.pod("uid-bert-a")["metadata"]["annotations"]
                  ["elastico.io/memory-budget-mib"])  # fmt: skip
    assert after < budget


def test_only_the_leader_reshapes_running_pods():
    cluster, engine = case_one(leader=False)
    engine.run_epoch()
    engine.run_epoch()
    assert cluster.seen == []
    assert engine.published.plan.epoch == 3  # it still plans; it only writes nothing
