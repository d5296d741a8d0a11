"""The decision's way into the container (issue 12, items 4 and 5).

Item 4: the webhook's patch, applied to a pod, gives the container an environment
under which ``elastico-run`` reads the downward-API file the patch mounts, so a
reconfiguration written by the extender restarts the workload with it.
Item 5: one memory budget: the annotation, the ConfigMap, the vLLM flag and the
``ELASTICO_GPU_MEMORY_UTILIZATION`` knob say the same thing, on 40 and 80 GB GPUs.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from elastico_extender.annotations import (
    ANNOTATIONS_FILE,
    ANNOTATIONS_FILE_ENV,
    decision_annotations,
)
from elastico_extender.api.app import create_app
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.core.handoff import framework_settings, framework_share, memory_share
from elastico_extender.core.model import Configuration, JobKind
from elastico_extender.launcher.assignment import read_assignment
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings

ROOT = Path(__file__).resolve().parents[1]


def gpu_node(name: str, memory_mib: int) -> dict:
    labels = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": str(memory_mib),
              "nvidia.com/gpu.product": "NVIDIA-A100"}  # fmt: skip
    alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "1"}
    return {"kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": alloc}}  # fmt: skip


def user_pod(name: str, family: str) -> dict:
    """A pod as a user writes it, before admission."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                     "annotations": {"elastico.io/family": family}},
        "spec": {"schedulerName": "elastico-scheduler", "containers": [{
            "name": "main", "image": "img", "env": [{"name": "USER_SETTING", "value": "kept"}],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Pending"},
    }  # fmt: skip


def apply_patch(doc: dict, patch: list[dict]) -> dict:
    """RFC 6902 for the ``add`` operations a mutating webhook returns (as the API server
    applies them): ``~1``/``~0`` escapes, ``-`` appends; anything else fails the test."""
    doc = copy.deepcopy(doc)
    for op in patch:
        assert op["op"] == "add", op
        *parents, last = [
            t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]
        ]
        target: Any = doc
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        if isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), op["value"])
        else:
            target[last] = op["value"]
    return doc


def admitted(client: httpx.Client, pod: dict) -> dict:
    """The pod after the mutating webhook: its JSON patch applied (RFC 6902)."""
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "r", "operation": "CREATE", "object": pod}}  # fmt: skip
    response = client.post("/mutate", json=review).json()["response"]
    patch = json.loads(base64.b64decode(response["patch"]))
    return apply_patch(pod, patch)


def container_env(pod: dict, cluster: EmbeddedCluster) -> dict[str, str]:
    """What the kubelet gives the container: values, configMapKeyRefs and the pod uid's
    fieldRef resolved."""
    env = {}
    for entry in pod["spec"]["containers"][0]["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
            continue
        field = entry["valueFrom"].get("fieldRef")
        if field is not None:
            assert field["fieldPath"] == "metadata.uid", field
            env[entry["name"]] = pod["metadata"]["uid"]
            continue
        ref = entry["valueFrom"]["configMapKeyRef"]
        data = cluster.configmaps[(pod["metadata"]["namespace"], ref["name"])]["data"]
        env[entry["name"]] = data[ref["key"]]
    return env


def downward_file(pod: dict) -> tuple[str, str]:
    """(mount path, file name) of the pod's metadata.annotations downward-API item."""
    for volume in pod["spec"]["volumes"]:
        for item in (volume.get("downwardAPI") or {}).get("items", ()):
            if item["fieldRef"]["fieldPath"] == "metadata.annotations":
                mounts = pod["spec"]["containers"][0]["volumeMounts"]
                mount = next(m for m in mounts if m["name"] == volume["name"])
                return mount["mountPath"], item["path"]
    raise AssertionError("no downward-API annotations volume")


def kubelet_write(directory: Path, annotations: dict[str, str]) -> None:
    """The kubelet's downward-API file: key="Go-quoted value" lines, swapped atomically."""
    text = "".join(f"{k}={json.dumps(v)}\n" for k, v in sorted(annotations.items()))
    tmp = directory / ".tmp"
    tmp.write_text(text)
    tmp.replace(directory / "annotations")


def wait_for(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def serve(*nodes: dict) -> Iterator[tuple[httpx.Client, str, EmbeddedCluster]]:
    cluster = EmbeddedCluster(list(nodes), "test")
    # reshape at once (no dwell): the test follows one reconfiguration through
    app = create_app(ServiceSettings(epoch_seconds=600, min_dwell_seconds=0), cluster)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        yield client, app.state.token, cluster


@pytest.fixture
def service() -> Iterator[tuple[httpx.Client, str, EmbeddedCluster]]:
    yield from serve(gpu_node("g40", 40960), gpu_node("g80", 81920))


@pytest.fixture
def one_gpu() -> Iterator[tuple[httpx.Client, str, EmbeddedCluster]]:
    yield from serve(gpu_node("g40", 40960))


def bind(client: httpx.Client, token: str, name: str, node: str) -> None:
    body = {"PodName": name, "PodNamespace": "ml", "PodUID": f"uid-{name}", "Node": node}
    reply = client.post("/scheduler/bind", json=body, headers={"Authorization": f"Bearer {token}"})
    assert reply.json() == {"Error": ""}


def test_the_webhook_env_points_elastico_run_at_the_file_it_mounts(service):
    client, _, _ = service
    pod = admitted(client, user_pod("p", "bert"))
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    mount, item = downward_file(pod)
    assert env[ANNOTATIONS_FILE_ENV]["value"] == f"{mount}/{item}" == ANNOTATIONS_FILE
    assert env["USER_SETTING"]["value"] == "kept"
    assert "ELASTICO_DECISION_FILE" not in env  # the name elastico-run never read


WORKLOAD = r"""
import os, signal, sys, time
log = open(sys.argv[1], "a")
log.write("start %s %s\n" % (os.environ.get("ELASTICO_MEMORY_BUDGET_MIB"),
                             os.environ.get("ELASTICO_CONFIGURATION")))
log.flush()
signal.signal(signal.SIGTERM, lambda *_: (log.write("term\n"), log.flush(), sys.exit(0)))
while True:
    time.sleep(0.05)
"""


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"],
                           capture_output=True)  # fmt: skip
    return probe.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="needs user+mount namespaces (unshare -rm)")
def test_reconfiguration_reaches_elastico_run_through_the_admitted_pod(one_gpu, tmp_path):
    """Webhook patch -> bind -> the container's exact env -> elastico-run; then an epoch
    reshapes the pod in place and the workload restarts with the new budget.

    The downward-API volume is mounted where the patch says (a private mount namespace
    puts a directory at that absolute path), so nothing in the env is rewritten."""
    client, token, cluster = one_gpu
    pod = admitted(client, user_pod("bert-a", "bert"))
    cluster.add_pod(pod)
    assert client.post("/scheduler/filter", json={"Pod": pod, "NodeNames": ["g40"]}).json()[
        "NodeNames"
    ] == ["g40"]
    bind(client, token, "bert-a", "g40")
    bound = cluster.state.pod_by_name("ml", "bert-a")
    env = container_env(bound, cluster)
    mount, _ = downward_file(bound)
    volume = tmp_path / "volume"
    volume.mkdir()
    kubelet_write(volume, bound["metadata"]["annotations"])
    log = tmp_path / "log"
    workload = tmp_path / "workload.py"
    workload.write_text(WORKLOAD)
    image_env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    # Inside: the host's /etc stays visible through symlinks on a private tmpfs, and the
    # volume is bind-mounted at the patch's mount path.
    script = (
        'set -e; real="$1"; shift; mkdir -p "$real"; mount --rbind /etc "$real"; '
        "mount -t tmpfs tmpfs /etc; "
        'for f in "$real"/* "$real"/.[!.]*; do [ -e "$f" ] && ln -s "$f" /etc/; done; '
        f'mkdir -p {mount}; mount --bind "$1" {mount}; shift; exec "$@"'
    )
    proc = subprocess.Popen(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh",
         str(tmp_path / "etc"), str(volume), sys.executable, "-m",
         "elastico_extender.launcher.run", "--poll-interval", "0.1", "--grace-period", "5",
         "--", sys.executable, str(workload), str(log)],
        env={**image_env, **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: log.exists() and log.read_text().count("start") == 1)
        first = log.read_text().split()
        assert first[1] == bound["metadata"]["annotations"]["elastico.io/memory-budget-mib"]
        # ResNet-50 arrives; the epoch reshapes BERT in place (spec 5.3 Case 1)
        cluster.add_pod(admitted(client, user_pod("resnet-b", "resnet50")))
        auth = {"Authorization": f"Bearer {token}"}
        assert client.post("/epoch", headers=auth).status_code == 200
        after = cluster.state.pod_by_name("ml", "bert-a")["metadata"]["annotations"]
        assert after["elastico.io/memory-budget-mib"] != first[1]
        kubelet_write(volume, after)  # the kubelet refreshes the downward-API file
        wait_for(lambda: log.read_text().count("start") == 2)
        lines = log.read_text().splitlines()
        assert lines[1] == "term"
        assert lines[2] == (
            f"start {after['elastico.io/memory-budget-mib']} "
            f"{after['elastico.io/assigned-configuration']}"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert "restarting workload" in err, err


@pytest.mark.parametrize("node", ["g40", "g80"])
def test_one_budget_in_annotation_configmap_and_vllm(service, node):
    client, token, cluster = service
    pod = admitted(client, user_pod(f"llm-{node}", "llama3-7b"))
    cluster.add_pod(pod)
    bind(client, token, f"llm-{node}", node)
    bound = cluster.state.pod_by_name("ml", f"llm-{node}")
    annotations = bound["metadata"]["annotations"]
    data = container_env(bound, cluster)
    budget = annotations["elastico.io/memory-budget-mib"]
    device = annotations["elastico.io/device-memory-mib"]
    assert device == data["ELASTICO_DEVICE_MEMORY_MIB"] == ("40960" if node == "g40" else "81920")
    assert budget == data["ELASTICO_MEMORY_BUDGET_MIB"]
    share = data["ELASTICO_MEMORY_FRACTION"]
    assert data["ELASTICO_GPU_MEMORY_UTILIZATION"] == share
    assert data["VLLM_GPU_MEMORY_UTILIZATION"] == share
    assert f"--gpu-memory-utilization={share}" in data["ELASTICO_VLLM_ARGS"].split()
    # the share frameworks fill: the budget's, less the context's reserve under MPS
    usable = framework_share(int(budget), int(device), annotations["elastico.io/mps"] == "true")
    assert share == usable.fraction
    assert float(share) * int(device) <= usable.budget_mib < (float(share) + 1e-4) * int(device)
    # and elastico-run, reading the annotations, computes the very same settings
    settings = read_assignment(annotations, {}).settings()
    for key in ("ELASTICO_MEMORY_BUDGET_MIB", "ELASTICO_GPU_MEMORY_UTILIZATION",
                "VLLM_GPU_MEMORY_UTILIZATION", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"):  # fmt: skip
        assert settings.env.get(key) == data.get(key), key
    assert f"--gpu-memory-utilization={share}" in settings.vllm_args


@pytest.mark.parametrize("budget", [26828.6, 26828.4, 26828.0, 40959.99])
def test_annotation_and_configmap_agree_on_a_fractional_budget(budget):
    config = Configuration((("batch_size", 32),))
    env = framework_settings(kind=JobKind.TRAINING, configuration=config,
                             memory_budget_mib=budget, device_memory_mib=40960.0,
                             device_indices=(0,))  # fmt: skip
    notes = decision_annotations(node="n", devices=(0,), kind=JobKind.TRAINING,
                                 configuration=config, memory_budget_mib=budget,
                                 device_memory_mib=40960.0, sm_share=0.5, mps=True,
                                 predicted_slowdown=1.0, price_epoch=1, configmap="c")  # fmt: skip
    share = memory_share(budget, 40960.0)
    assert notes["elastico.io/memory-budget-mib"] == env["ELASTICO_MEMORY_BUDGET_MIB"]
    assert env["ELASTICO_MEMORY_BUDGET_MIB"] == str(share.budget_mib) == str(int(budget))
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == f"max_split_size_mb:{share.budget_mib}"
    assert float(env["ELASTICO_MEMORY_FRACTION"]) * 40960 <= budget  # never above the budget
