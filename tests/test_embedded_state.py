"""The embedded cluster keeps what bind wrote across a kill -9 when given a state file
(issue 12 item 7): bound pods stay bound with their decisions, and a pod that did not
opt in is counted on the same devices as before, not guessed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_service_behaviour import elastic_pod, gpu_node

from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.engine import Engine
from elastico_extender.service.settings import ServiceSettings

TESTS = Path(__file__).resolve().parent

SCRIPT = """
import json, os, signal, sys
sys.path.insert(0, sys.argv[2])
from test_embedded_state import objects
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.engine import Engine
from elastico_extender.service.settings import ServiceSettings

cluster = EmbeddedCluster(objects(), "test", state_file=sys.argv[1])
engine = Engine(ServiceSettings(epoch_seconds=3600), cluster)
engine.run_epoch()
assert engine.bind("ml", "a", "uid-a", "g0") == ""
assert engine.bind("ml", "late", "uid-late", "g0") == ""
assert engine.bind("ml", "web", "uid-web", "g0") == ""     # no opt-in: a whole GPU
cluster.delete_pod("ml", "late")                           # its GPU is free again
engine.run_epoch()
print(json.dumps(engine.nodes()), flush=True)
os.kill(os.getpid(), signal.SIGKILL)                       # no cleanup of any kind
"""


def objects() -> list[dict]:
    web = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "web", "namespace": "ml", "uid": "uid-web"},
           "spec": {"schedulerName": "elastico-scheduler", "containers": [{"name": "c",
                    "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
           "status": {"phase": "Pending"}}  # fmt: skip
    return [gpu_node("g0", gpus=3), elastic_pod("a"), elastic_pod("late", "resnet50"), web]


def occupancy(rows: list[dict]) -> dict[int, list[str]]:
    return {g["index"]: sorted(g["pods"]) for g in rows[0]["gpus"]}


def test_binds_and_devices_survive_a_kill_9(tmp_path: Path) -> None:
    state = tmp_path / "embedded-state.json"
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(state), str(TESTS)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == -9, run.stderr
    before = occupancy(json.loads(run.stdout))
    restarted = EmbeddedCluster(objects(), "restart", state_file=str(state))
    pods = {p["metadata"]["name"]: p for p in restarted.state.pods().values()}
    assert set(pods) == {"a", "web"}  # "late" stays deleted
    assert pods["a"]["spec"]["nodeName"] == "g0" and pods["web"]["spec"]["nodeName"] == "g0"
    assert "elastico.io/memory-budget-mib" in pods["a"]["metadata"]["annotations"]
    engine = Engine(ServiceSettings(epoch_seconds=3600), restarted)
    engine.run_epoch()
    assert occupancy(engine.nodes()) == before
    # web was bound to GPU 2; GPU 1 is free since "late" went: a guess would say GPU 1
    assert before[2] == ["ml/web"] and before[1] == []


def test_without_a_state_file_nothing_is_written(tmp_path: Path) -> None:
    cluster = EmbeddedCluster(objects(), "memory")
    cluster.add_pod(elastic_pod("b"))
    assert list(tmp_path.iterdir()) == []
    assert cluster.state_file is None


BROKEN_FILES = {
    "nested": ("[" * 200_000, "nested too deeply"),
    "metadata-array": (
        json.dumps({"kind": "List", "items": [{"kind": "Node", "metadata": ["x"]}]}),
        "items[0].metadata: must be an object",
    ),
    "pod-spec-array": (
        json.dumps({"kind": "List", "items": [
            {"kind": "Pod", "metadata": {"name": "p"}, "spec": ["x"]}]}),
        "items[0].spec: must be an object",
    ),
    "container-not-object": (
        json.dumps({"kind": "List", "items": [
            {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [7]}}]}),
        "items[0].spec.containers[0]: must be an object",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BROKEN_FILES))
def test_an_embedded_file_of_the_wrong_shape_names_the_field(tmp_path: Path, case: str) -> None:
    """Before: a Pod whose spec is an array crashed the first epoch with a traceback; a
    metadata array or deep nesting ended the start with Python's own words."""
    from elastico_extender.cluster.embedded import load_objects

    text, said = BROKEN_FILES[case]
    path = tmp_path / "cluster.json"
    path.write_text(text)
    with pytest.raises(ValueError) as caught:
        load_objects(path)
    assert str(caught.value).startswith(f"{path}: ") and said in str(caught.value)


def test_a_state_file_with_a_resource_version_in_other_digits_is_read(tmp_path: Path) -> None:
    """'²' passes str.isdigit and int() refused it: the restart raised ValueError."""
    state = tmp_path / "state.json"
    node = gpu_node("n1")
    node["metadata"]["resourceVersion"] = "²"
    state.write_text(json.dumps({"kind": "List", "items": [node]}))
    cluster = EmbeddedCluster([], state_file=state)
    assert list(cluster.state.nodes()) == ["n1"]


def test_an_embedded_file_of_more_nodes_than_the_extender_takes_is_refused(
    tmp_path: Path,
) -> None:
    """200,000 nodes (1.6 million GPUs) started and then would not stop promptly; an
    embedded cluster now holds at most what one extender request may carry."""
    from elastico_extender.cluster.embedded import load_objects
    from elastico_extender.core.resources import MAX_NODES

    items = [{"kind": "Node", "metadata": {"name": f"n{i}"}} for i in range(MAX_NODES + 1)]
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"kind": "List", "items": items}))
    with pytest.raises(ValueError, match=r"65,537 nodes; an embedded cluster holds at most 65,536"):
        load_objects(path)
    path.write_text(json.dumps({"kind": "List", "items": items[:MAX_NODES]}))
    assert len(load_objects(path)) == MAX_NODES


def test_a_reconfiguration_for_another_uid_leaves_the_same_named_pod_alone() -> None:
    """As on a real API server (the patch carries the UID): the embedded cluster refuses
    a reconfiguration whose UID is not the pod's, a successor of the same name."""
    from elastico_extender.cluster.base import BindRequest, ClusterError

    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    pod = elastic_pod("p")
    pod["spec"]["nodeName"] = "g0"
    cluster.add_pod(pod)
    request = BindRequest("ml", "p", "uid-of-the-deleted-p", "g0",
                          {"elastico.io/assigned-devices": "0"})  # fmt: skip
    with pytest.raises(ClusterError) as refused:
        cluster.reconfigure(request)
    assert "uid-of-the-deleted-p" in str(refused.value)
    annotations = (cluster.state.pod("uid-p") or {})["metadata"]["annotations"]
    assert "elastico.io/assigned-devices" not in annotations
