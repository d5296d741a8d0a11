"""REST views at the edge (issue 12, item 17): every /jobs row names its pod."""

from __future__ import annotations

import httpx

from elastico_extender.api.app import create_app
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings


def test_invalid_pods_in_jobs_carry_their_pod_name():
    node = {"kind": "Node", "metadata": {"name": "g0", "labels": {"nvidia.com/gpu.count": "1"}},
            "status": {"allocatable": {"nvidia.com/gpu": "1"}}}  # fmt: skip
    bad = {"kind": "Pod", "metadata": {"name": "typo", "namespace": "ml", "uid": "uid-typo",
           "annotations": {"elastico.io/family": "bert", "elastico.io/wieght": "2"}},
           "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}  # fmt: skip
    cluster = EmbeddedCluster([node, bad], "test")
    app = create_app(ServiceSettings(epoch_seconds=600), cluster)
    with ServerThread(app) as server:
        rows = httpx.get(f"{server.url}/jobs").json()
    invalid = [r for r in rows if r["state"] == "invalid"]
    assert len(invalid) == 1
    assert invalid[0]["pod"] == "ml/typo"
    assert "elastico.io/wieght" in invalid[0]["reason"]
