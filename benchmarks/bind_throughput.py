"""Binds per second through the Kubernetes client against the fake API server.

Command (from the repository root; ``PYTHONPATH`` picks the extender code measured,
the fake API server always comes from this checkout):

    PYTHONPATH=. python benchmarks/bind_throughput.py
    PYTHONPATH=/work/main python benchmarks/bind_throughput.py   # another checkout's bind

The fake API server (``cluster/fake_apiserver.py``: real HTTP/1.1, real list/watch,
Binding, ConfigMap and patch semantics) runs in its own process with 50 nodes of 4
A100-40GB GPUs and 200 pending opted-in pods.  The extender side is the real
``KubeCluster`` (official ``kubernetes`` client) and ``Engine`` in this process:
after the view has synced and one epoch ran, every pod is bound through
``Engine.bind`` by 1 thread (kube-scheduler's binding cycle for one pod at a time)
and by 8 threads (binds of several pods in flight).  Each API write waits
``--write-ms`` (20 ms: a real API server's etcd commit; on loopback the fake answers
in about 1 ms, so round trips would not show).  Reported: binds/s over the whole
run (filter included), mean and p95 latency of one bind, API server writes per
bind, and a check that every bound pod carries its decision annotations; the median
of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _args import comma_list, positive_int

HERE = Path(__file__).resolve().parents[1]

SERVER = r"""
import json, sys
from elastico_extender.cluster.fake_apiserver import FakeApiServer
nodes, pods = int(sys.argv[1]), int(sys.argv[2])
srv = FakeApiServer().start()
srv.write_delay = float(sys.argv[3]) / 1000.0
labels = {"nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "40960",
          "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "4", "pods": "110"}
for i in range(nodes):
    srv.put("nodes", {"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": f"n{i:03d}", "labels": labels},
                      "status": {"allocatable": alloc, "capacity": alloc}})
families = ("bert", "resnet50", "ncf", "lstm")
for k in range(pods):
    srv.put("pods", {"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"p{k:04d}", "namespace": "ml", "uid": f"uid-p{k:04d}",
                     "annotations": {"elastico.io/family": families[k % 4],
                                     "elastico.io/configmap": f"elastico-p{k:04d}"}},
        "spec": {"schedulerName": "elastico-scheduler",
                 "containers": [{"name": "main", "image": "img",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                 "volumes": [{"name": "elastico-decision", "downwardAPI": {"items": [
                     {"path": "annotations",
                      "fieldRef": {"fieldPath": "metadata.annotations"}}]}}]},
        "status": {"phase": "Pending"}})
print(srv.url, flush=True)
sys.stdin.read()
print(json.dumps([r for r in srv.requests if not r.startswith("GET")]), flush=True)
"""


def run(threads: int, nodes: int, pods: int, write_ms: float) -> dict[str, Any]:
    from kubernetes import client

    from elastico_extender.cluster.kube import KubeCluster
    from elastico_extender.service.engine import Engine
    from elastico_extender.service.settings import ServiceSettings

    env = dict(os.environ, PYTHONPATH=str(HERE))
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(nodes), str(pods), str(write_ms)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert server.stdout is not None
    url = server.stdout.readline().strip()
    kube = KubeCluster(client.ApiClient(client.Configuration(host=url)))
    kube.start()
    try:
        assert kube.wait_synced(30)
        engine = Engine(ServiceSettings(epoch_seconds=3600), kube)
        engine.run_epoch()
        names = sorted(p["metadata"]["name"] for p in kube.state.pods().values())
        queue = list(names)
        lock = threading.Lock()
        latencies: list[float] = []
        errors: list[str] = []

        def worker() -> None:
            while True:
                with lock:
                    if not queue:
                        return
                    name = queue.pop()
                pod = kube.state.pod_by_name("ml", name) or {}
                took = 0.0
                for _ in range(3):  # the scheduler tries again after a refused bind
                    node = engine.filter(pod, list(kube.state.nodes())).passed
                    started = time.perf_counter()
                    error = engine.bind("ml", name, f"uid-{name}", node[0]) if node else "no node"
                    took += time.perf_counter() - started
                    if not error:
                        break
                with lock:
                    latencies.append(took)
                    if error:
                        errors.append(error)

        started = time.perf_counter()
        workers = [threading.Thread(target=worker) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - started
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            bound = [p for p in kube.state.pods().values() if p["spec"].get("nodeName")]
            if len(bound) >= len(names) - len(errors):
                break
            time.sleep(0.05)
        with_decision = sum(
            1
            for p in bound
            if "elastico.io/assigned-devices" in (p["metadata"].get("annotations") or {})
        )
    finally:
        kube.stop()
        server.stdin.close()  # type: ignore[union-attr]
        writes = json.loads(server.stdout.readline() or "[]")
        server.wait(timeout=10)
    ok = len(names) - len(errors)
    latencies.sort()
    return {
        "threads": threads,
        "binds": ok,
        "errors": len(errors),
        "binds_per_s": ok / elapsed,
        "mean_ms": 1000 * statistics.fmean(latencies),
        "p95_ms": 1000 * latencies[int(0.95 * (len(latencies) - 1))],
        "bound_with_decision": with_decision,
        "bound": len(bound),
        "sample": sorted({e[:120] for e in errors})[:3],
        "writes_per_bind": len(writes) / max(ok, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=positive_int, default=50)
    parser.add_argument("--pods", type=positive_int, default=200)
    parser.add_argument("--threads", type=comma_list(positive_int), default="1,8")
    parser.add_argument(
        "--write-ms", type=float, default=20.0, help="time each API write takes (etcd commit)"
    )
    parser.add_argument(
        "--repeat", type=positive_int, default=3, help="runs per row; the median is shown"
    )
    args = parser.parse_args()
    import elastico_extender

    print(f"extender code: {Path(elastico_extender.__file__).parent}")
    print(f"load average: {os.getloadavg()[0]:.2f}")
    print(f"API server writes take {args.write_ms:g} ms each; median of {args.repeat} runs")
    print("| threads | binds | errors | binds/s | mean ms | p95 ms | writes/bind | with decision |")
    print("|---|---|---|---|---|---|---|---|")
    for threads in args.threads:
        runs = [run(threads, args.nodes, args.pods, args.write_ms) for _ in range(args.repeat)]
        r = sorted(runs, key=lambda x: x["binds_per_s"])[len(runs) // 2]
        print(
            f"| {r['threads']} | {r['binds']} | {r['errors']} | {r['binds_per_s']:.1f} | "
            f"{r['mean_ms']:.1f} | {r['p95_ms']:.1f} | {r['writes_per_bind']:.2f} | "
            f"{r['bound_with_decision']}/{r['bound']} |"
        )
        for error in r["sample"]:
            print(f"  error: {error}")
    print(json.dumps({"nodes": args.nodes, "pods": args.pods, "write_ms": args.write_ms}))


if __name__ == "__main__":
    main()
