"""Cost of the closed loop's observing half in the extender (issue 11).

Command (from the repository root):

    PYTHONPATH=. python benchmarks/observation_ingest.py            # 1,000 and 10,000 pods
    PYTHONPATH=. python benchmarks/observation_ingest.py --quick    # 1,000 pods

A cluster of nodes with 8 GPUs (80 GB) each carries two running opted-in pods per GPU
(the catalog's families in turn), all bound with decision annotations and carrying the
webhook's decision volume (without it a pod is held as whole GPUs and never observed as
sharing), in the embedded cluster (real Pod JSON).  After one epoch, each row times,
median of ``--reps``:

* ``ingest 8`` / ``ingest 16``: ``ObservationService.ingest`` of one agent's batch of
  that many windows, half and all of its node's pods (validation against the published
  plan, the book, pair statistics; no SQLite, which the service writes after releasing
  its lock), with the collector frozen after the warm-up as ``elastico serve`` freezes it
  after each epoch;
* ``ingest 32x16``: the batches of 32 nodes, one after another (512 windows);
* ``POST 16``: one node's batch over HTTP to uvicorn on 127.0.0.1, keep-alive, bearer
  token (round trip as an agent sees it).

An agent reports only its own node's pods (the extender refuses a window for a pod
bound elsewhere), so every batch comes from the node its pods run on;
* ``for_snapshot``: the engine's per-epoch call with every pod observed;
* ``snapshot +obs`` / ``snapshot -obs``: the engine's ``build_snapshot`` (the one place
  an epoch touches the observations) with and without them wired in, alternating.

``wall`` is the median elapsed time, ``cpu`` this process's CPU time (the POST row's
includes the server thread's); on a shared machine the wall time of the longer calls
includes time the process waited for a core.  Results and the command that made them:
``benchmarks/results/observation_ingest.md``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable

import httpx

from elastico_extender.annotations import DECISION_VOLUME
from elastico_extender.api.app import create_app
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.core.shapes.catalog import CATALOG, catalog_families
from elastico_extender.service.observations import AgentWindow
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings

FAMILIES = catalog_families()


PER_NODE = 16
"""Pods per node: 8 GPUs, two tenants each (pod ``u{i}`` runs on node ``n{i // 16}``)."""


def cluster_objects(pods: int) -> list[dict]:
    per_node = PER_NODE
    objects: list[dict] = []
    names = [n for n in CATALOG if FAMILIES[n].resources[:, 1].min() <= 40960]
    for n in range((pods + per_node - 1) // per_node):
        labels = {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81920",
                  "nvidia.com/gpu.product": "NVIDIA-H100-80GB"}  # fmt: skip
        alloc = {"cpu": "128", "memory": "2048Gi", "nvidia.com/gpu": "8", "pods": "110"}
        objects.append({"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": f"n{n}", "labels": labels},
                        "status": {"allocatable": alloc, "capacity": alloc}})  # fmt: skip
    for i in range(pods):
        family = FAMILIES[names[i % len(names)]]
        lean = int(family.resources[:, 1].argmin())
        node, gpu = divmod(i, per_node)
        annotations = {
            "elastico.io/family": family.workload,
            "elastico.io/assigned-node": f"n{node}",
            "elastico.io/assigned-devices": str(gpu // 2),
            "elastico.io/assigned-configuration": family.configs[lean].label,
        }
        objects.append({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": f"p{i}", "namespace": "ml", "uid": f"u{i}",
                                     "annotations": annotations},
                        "spec": {"schedulerName": "elastico-scheduler", "nodeName": f"n{node}",
                                 "containers": [{"name": "m", "image": "i", "resources": {
                                     "limits": {"nvidia.com/gpu": "1"}}}],
                                 "volumes": [{"name": DECISION_VOLUME,
                                              "downwardAPI": {"items": []}}]},
                        "status": {"phase": "Running"}})  # fmt: skip
    return objects


def median_ms(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    """Median wall and CPU (this process) milliseconds per call."""
    wall, cpu = [], []
    for _ in range(reps):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def run(pods: int, reps: int) -> list[tuple[str, tuple[float, float]]]:
    app = create_app(ServiceSettings(epoch_seconds=3600), EmbeddedCluster(cluster_objects(pods)))
    engine = app.state.engine
    service = app.state.observations
    engine.run_epoch()
    clock = [time.time()]
    service.clock = lambda: clock[0]

    names = [n for n in CATALOG if FAMILIES[n].resources[:, 1].min() <= 40960]
    units = [FAMILIES[names[i % len(names)]].throughput_unit for i in range(pods)]

    def batch(node: int, size: int = PER_NODE) -> tuple[str, list[AgentWindow]]:
        """The agent of node ``node``: its first ``size`` pods' windows."""
        clock[0] += 1.0
        first = node * PER_NODE
        uids = range(first, min(first + size, pods))
        return f"n{node}", [AgentWindow(f"u{i}", clock[0], 5.0, 10.0, units[i]) for i in uids]

    nodes = (pods + PER_NODE - 1) // PER_NODE
    # every pod observed once (framework units: the profile's T(c) is the reference), so
    # every pod has an observed slowdown; then, as `elastico serve` does after each
    # epoch, everything alive leaves the collector's scanned generations
    for node in range(nodes):
        service.ingest(*batch(node))
    assert len(service.book.observed()) == pods
    gc.freeze()
    rows = [
        ("ingest 8", median_ms(lambda: service.ingest(*batch(0, 8)), reps)),
        ("ingest 16", median_ms(lambda: service.ingest(*batch(0)), reps)),
    ]
    if nodes >= 32:
        many = median_ms(lambda: [service.ingest(*batch(n)) for n in range(32)], reps)
        rows.append(("ingest 32x16", many))
    rows.append(("for_snapshot", median_ms(service.for_snapshot, reps)))
    builder = engine.builder
    source = builder.observed
    with_obs, without = [], []
    for _ in range(reps):
        builder.observed = source
        with_obs.append(median_ms(engine.build_snapshot, 1))
        builder.observed = None
        without.append(median_ms(engine.build_snapshot, 1))
    builder.observed = source
    rows += [
        ("snapshot +obs", tuple(statistics.median(x) for x in zip(*with_obs, strict=True))),
        ("snapshot -obs", tuple(statistics.median(x) for x in zip(*without, strict=True))),
    ]  # type: ignore[list-item]
    server = ServerThread(app).start(timeout=300)  # its first epoch: seconds at 10,000 pods
    try:
        with httpx.Client(base_url=server.url, headers={
                "Authorization": f"Bearer {app.state.token}"}) as http:  # fmt: skip

            def post() -> None:
                node, windows = batch(0)
                items = [
                    {"pod_uid": w.pod_uid, "end": w.end, "seconds": w.seconds, "rate": w.rate,
                     "unit": w.unit}
                    for w in windows
                ]  # fmt: skip
                reply = http.post("/observations", json={"node": node, "observations": items})
                assert reply.status_code == 200, reply.text

            rows.append(("POST 16", median_ms(post, reps)))
    finally:
        server.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    sizes = (1000,) if args.quick else (1000, 10000)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'pods':>6} {'what':<14} {'wall ms':>9} {'cpu ms':>9}")
    for pods in sizes:
        for what, (wall, cpu) in run(pods, args.reps):
            print(f"{pods:>6} {what:<14} {wall:>9.3f} {cpu:>9.3f}")


if __name__ == "__main__":
    main()
