"""Restarts per pod after a burst: how often the epoch reshapes pods it just bound.

Command (from the repository root; ``PYTHONPATH`` picks the extender code measured):

    PYTHONPATH=. python benchmarks/restart_storm.py
    PYTHONPATH=/work/main python benchmarks/restart_storm.py     # another checkout

Every in-place reconfiguration restarts the workload (``elastico-run`` restarts it
when its assignment changes), so a pod reshaped seconds after it started loses its
warm-up for nothing (issue 12 item 6).  The scenario: an embedded cluster of 10
nodes with 4 A100-40GB GPUs each; a burst of ``--pods`` opted-in pods (training and
inference families in turn, all admitted through the webhook) arrives at
``--rate`` pods/s while the epoch loop plans every 5 s.  Each pod goes through
filter, prioritize and bind to its best-scored node, as kube-scheduler would.  Time
is simulated (the engine's clock), so the figure does not depend on the machine.
Reported: pods bound, pods reconfigured within 60 s of their bind, reconfigurations
per bound pod within 60 s and over the whole ``--horizon``.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from _args import positive_float, positive_int

FAMILIES = ("bert", "resnet50", "llama3-7b", "ncf", "qwen-1.7b", "lstm")
EPOCH_SECONDS = 5.0
WINDOW = 60.0


def node(i: int) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "40960",
              "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}  # fmt: skip
    alloc = {"cpu": "128", "memory": "1024Gi", "nvidia.com/gpu": "4", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"n{i:02d}",
            "labels": labels}, "status": {"allocatable": alloc, "capacity": alloc}}  # fmt: skip


def pod(k: int) -> dict[str, Any]:
    name = f"burst-{k:03d}"
    volume = {"name": "elastico-decision", "downwardAPI": {"items": [
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                         "annotations": {"elastico.io/family": FAMILIES[k % len(FAMILIES)],
                                         "elastico.io/configmap": f"elastico-{name}"}},
            "spec": {"schedulerName": "elastico-scheduler", "volumes": [volume],
                     "containers": [{"name": "main", "image": "img",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}}  # fmt: skip


def run(pods: int, rate: float, horizon: float, nodes: int) -> dict[str, Any]:
    from elastico_extender.cluster.base import BindRequest
    from elastico_extender.cluster.embedded import EmbeddedCluster
    from elastico_extender.service.engine import Engine
    from elastico_extender.service.settings import ServiceSettings

    now = [0.0]
    reconfigured: dict[str, list[float]] = defaultdict(list)

    class Recording(EmbeddedCluster):
        def reconfigure(self, request: BindRequest) -> None:
            super().reconfigure(request)
            reconfigured[request.name].append(now[0])

    cluster = Recording([node(i) for i in range(nodes)], "burst")
    engine = Engine(ServiceSettings(epoch_seconds=EPOCH_SECONDS), cluster, clock=lambda: now[0])
    engine.run_epoch()
    names = [n["metadata"]["name"] for n in cluster.state.nodes().values()]
    bound_at: dict[str, float] = {}
    next_epoch = EPOCH_SECONDS
    arrivals = [(k / rate, k) for k in range(pods)]
    queue: list[int] = []
    while now[0] <= horizon:
        while arrivals and arrivals[0][0] <= now[0]:
            k = arrivals.pop(0)[1]
            cluster.add_pod(pod(k))
            queue.append(k)
        for k in list(queue):  # the scheduler's cycle for every pending pod, in order
            obj = cluster.state.pod(f"uid-burst-{k:03d}")
            passed = engine.filter(obj, names).passed
            if not passed:
                continue
            scores = dict(engine.prioritize(obj, passed).pairs())
            best = max(passed, key=lambda n: scores[n])
            if engine.bind("ml", f"burst-{k:03d}", f"uid-burst-{k:03d}", best) == "":
                bound_at[f"burst-{k:03d}"] = now[0]
                queue.remove(k)
        if now[0] >= next_epoch:
            engine.run_epoch()
            next_epoch += EPOCH_SECONDS
        now[0] = round(now[0] + 0.25, 6)
    early = {
        name: sum(1 for t in reconfigured.get(name, ()) if t - at <= WINDOW)
        for name, at in bound_at.items()
    }
    total = sum(len(reconfigured.get(name, ())) for name in bound_at)
    gaps = sorted(
        t - bound_at[name] for name, ts in reconfigured.items() if name in bound_at for t in ts
    )
    return {
        "bound": len(bound_at),
        "pending": len(queue),
        "pods_reconfigured_60s": sum(1 for v in early.values() if v),
        "restarts_per_pod_60s": sum(early.values()) / max(len(bound_at), 1),
        "restarts_per_pod_total": total / max(len(bound_at), 1),
        "first_gaps_s": gaps[:5],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=positive_int, default=100)
    parser.add_argument("--nodes", type=positive_int, default=10, help="nodes of 4 GPUs")
    parser.add_argument("--rate", type=positive_float, default=20.0, help="arrivals per second")
    parser.add_argument("--horizon", type=positive_float, default=180.0, help="simulated seconds")
    args = parser.parse_args()
    import elastico_extender

    print(f"extender code: {Path(elastico_extender.__file__).parent}")
    r = run(args.pods, args.rate, args.horizon, args.nodes)
    print("| pods | bound | still pending | reconfigured within 60 s | restarts/pod 60 s | "
          "restarts/pod total |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    print(
        f"| {args.pods} | {r['bound']} | {r['pending']} | {r['pods_reconfigured_60s']} | "
        f"{r['restarts_per_pod_60s']:.2f} | {r['restarts_per_pod_total']:.2f} |"
    )
    print("earliest reconfigurations after a bind (s):", [round(g, 2) for g in r["first_gaps_s"]])
    print(json.dumps(vars(args)))


if __name__ == "__main__":
    main()
